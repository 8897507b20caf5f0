"""DVC stage: retrieval metrics of one run's test embeddings (metrics/<dataset>/<noise>/<method>/seed<k>.json),
or, with --chain KEY, of the chained run chains.<KEY>."""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.evaluate import evaluate, evaluate_chain

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise", "method", "seed"), evaluate, chain_work=evaluate_chain)
