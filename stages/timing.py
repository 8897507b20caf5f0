"""DVC stage (opt-in): seconds per training epoch of one timing.entries method (timing/<entry>.json)."""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("timing", "train", "methods", "evaluate", "datasets", "noise", "weights", "pretrain")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.timing import timing

    return lambda params, args: timing(params, args.entry)


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: parser.add_argument("--entry", required=True), _load, SECTIONS)
