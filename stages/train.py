"""DVC stage: train a run, or a chained run's seeds.

--run-folder runs/<dataset>/<noise>/<name>/seed<k>
    a grid run of params.yaml named by its folder (the stage's output; name = the method)
--run-folder runs/<dataset>/<noise>/<name>
    a chained run (chains.<key>.name): each of its seeds, one after another
--study NAME --run-folder ...
    one of study NAME's own runs (noisydml.studies: BSPML's embedding sizes and cells, SGPS's ablations)

A killed run resumes from its last epoch's checkpoint when started again with the same params and code.
"""

from noisydml.cli import add_train_arguments, run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("train", "methods", "evaluate", "datasets", "noise", "weights", "pretrain", "tracking", "chains", "figures")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.train import run_from_arguments

    return run_from_arguments


if __name__ == "__main__":
    run_stage(__doc__, add_train_arguments, _load, SECTIONS)
