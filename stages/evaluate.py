"""DVC stage: retrieval metrics of one run on its test split (metrics/<dataset>/<noise>/<method>/seed<k>.json)."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.evaluate import evaluate

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise", "method", "seed"), evaluate)
