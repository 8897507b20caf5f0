"""DVC stage: train one run.

--run runs/<dataset>/<noise>/<name>/seed<k>   a run of params.yaml, named by its folder (the stage's output): a run
                                              of the grid (name = the method), a chained run (chains.<key>.name),
                                              or a figure's own run (noisydml.runs expands them all)

A killed run resumes from its last epoch's checkpoint when started again with the same params and code.
"""

from noisydml.cli import add_train_arguments, run_stage


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.train import run_from_arguments

    return run_from_arguments


if __name__ == "__main__":
    run_stage(__doc__, add_train_arguments, _load)
