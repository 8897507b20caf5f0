"""DVC stage: prepare one dataset (data/prepared/<dataset>)."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.prepare import prepare

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), prepare)
