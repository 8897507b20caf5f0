"""DVC stage: retrieval metrics of every run of one dataset, grid and chained runs
(metrics/<dataset>/<noise>/<run>/seed<k>.json); runs whose inputs did not change keep their metrics."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.evaluate import evaluate

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), evaluate)
