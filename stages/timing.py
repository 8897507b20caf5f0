"""DVC stage: seconds per training epoch of the methods in params.yaml's `timing` section (timing/<dataset>.json)."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline import timing

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), timing)
