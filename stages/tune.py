"""DVC stage: one tuning study -> tuning/<dataset>/<noise>/<name>/ (params.yaml `tuning`; README "Tuning every method with the same budget").

--dataset D --noise N --method M
    tunes M on D/N's noisy training labels: tuning.trials trials over tuning.spaces.M, each scored by the P@1 of
    tuning.validation_classes held-out training classes (never the test split); writes chosen.json, which the
    tuned runs M_tuned (stage train_tuned@D-N-M-<seed>) train with.
--dataset D --noise N --chain C
    the same for the chained run named C at D/N (tuning.chains): its upstream runs are trained once on the same
    split, then each trial trains C's own step over its method's space; C_tuned (stage train_tuned_chain@D-N-C).

A killed study resumes with the same trials when started again (Optuna's journal in the output folder).
"""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("tuning", "train", "methods", "evaluate", "datasets", "noise", "weights", "pretrain", "tracking", "chains")


def _arguments(parser):
    for key in ("dataset", "noise"):
        parser.add_argument(f"--{key}", required=True)
    subject = parser.add_mutually_exclusive_group(required=True)
    subject.add_argument("--method")
    subject.add_argument("--chain")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.tune import tune
    from noisydml.schema import ParamsError

    def work(params, args):
        tuning = params["tuning"]
        kind = "method" if args.method else "chain"
        for key in ("dataset", "noise", kind):
            if getattr(args, key) not in tuning[key + "s"]:
                raise ParamsError(f"--{key} {getattr(args, key)!r} is not in tuning.{key}s ({tuning[key + 's']})")
        tune(params, args.dataset, args.noise, args.method or args.chain)

    return work


if __name__ == "__main__":
    run_stage(__doc__, _arguments, _load, SECTIONS)
