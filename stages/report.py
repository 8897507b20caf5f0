"""DVC stage: tables, plots and combined metrics of the whole grid (reports/)."""

from noisydml.cli import run_stage


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.report import report

    return lambda params, args: report(params)


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, _load)
