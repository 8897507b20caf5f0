"""DVC stage: inject one noise setting into one dataset's training labels (data/noisy/<dataset>/<noise>)."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.corrupt import corrupt

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise"), corrupt)
