"""DVC stage: train one method on one noisy dataset with one seed (runs/<dataset>/<noise>/<method>/seed<k>),
or, with --chain KEY, the chained run chains.<KEY> of params.yaml from its upstream run.

A killed run resumes from its last epoch's checkpoint when started again with the same params and code.
"""

from noisydml.cli import run_grid_stage
from noisydml.pipeline.train import train, train_chain

if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise", "method", "seed"), train, chain_work=train_chain)
