"""DVC stage: train one run.

--dataset D --noise N --method M --seed S   a run of the grid (runs/<D>/<N>/<M>/seed<S>)
--chain KEY                                 the chained run chains.<KEY> of params.yaml, from its upstream run
--method M --embedding-dim DIM --seed S     a point of figures.embedding_size (runs/<D>/<N>/<M>_dim<DIM>/seed<S>)
--lam L --mu MU --seed S                    a cell of figures.bspml_cells (runs/<D>/<N>/bspml_lam<L>_mu<MU>/seed<S>)
--sgps-ablation V --seed S                  a variant of figures.sgps_ablations (runs/<D>/<N>/sgps_<V>/seed<S>)

A killed run resumes from its last epoch's checkpoint when started again with the same params and code.
"""

from noisydml.cli import add_train_arguments, run_stage


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.train import run_from_arguments

    return run_from_arguments


if __name__ == "__main__":
    run_stage(__doc__, add_train_arguments, _load)
