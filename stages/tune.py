"""DVC stage: one tuning study -> tuning/<dataset>/<noise>/<method>/ (params.yaml `tuning`; README "Tuning").

--dataset D --noise N --method M
    tunes M on D/N's noisy training labels: tuning.trials trials over tuning.spaces.M, each scored by the P@1 of
    tuning.validation_classes held-out training classes (never the test split); writes chosen.json, which the
    tuned runs M_tuned (stage train_tuned@D-N-M-<seed>) train with.

A killed study resumes with the same trials when started again (Optuna's journal in the output folder).
"""

from noisydml.cli import run_stage


def _arguments(parser):
    for key in ("dataset", "noise", "method"):
        parser.add_argument(f"--{key}", required=True)


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.tune import tune
    from noisydml.schema import ParamsError

    def work(params, args):
        tuning = params["tuning"]
        for key in ("dataset", "noise", "method"):
            if getattr(args, key) not in tuning[key + "s"]:
                raise ParamsError(f"--{key} {getattr(args, key)!r} is not in tuning.{key}s ({tuning[key + 's']})")
        tune(params, args.dataset, args.noise, args.method)

    return work


if __name__ == "__main__":
    run_stage(__doc__, _arguments, _load)
