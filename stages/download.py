"""DVC stage: fetch one dataset's files (data/raw/<dataset>); nothing for the embedded and folder datasets."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.download import download

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), download)
