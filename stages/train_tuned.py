"""DVC stage: train a tuned run with the values its tune stage chose (params.yaml `tuning`; README "Tuning every method with the same budget").

--run-folder runs/<dataset>/<noise>/<method>_tuned/seed<k>
    a tuned method at one seed (stage train_tuned@<dataset>-<noise>-<method>-<seed>)
--run-folder runs/<dataset>/<noise>/<chain>_tuned
    a tuned chained run, each of its seeds (stage train_tuned_chain@<dataset>-<noise>-<chain>)

A killed run resumes from its last epoch's checkpoint when started again with the same params and code.
"""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("train", "methods", "evaluate", "datasets", "noise", "weights", "pretrain", "tracking", "chains", "figures",
            "tuning")


def _arguments(parser):
    parser.add_argument("--run-folder", required=True, help="runs/<dataset>/<noise>/<name>_tuned[/seed<k>]: a tuned "
                                                            "run of params.yaml (tuning)")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.train_tuned import run_from_arguments

    return run_from_arguments


if __name__ == "__main__":
    run_stage(__doc__, _arguments, _load, SECTIONS)
