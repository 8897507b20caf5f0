"""DVC stage: tables, plots and combined metrics of the whole grid (reports/)."""

from noisydml.cli import run_stage

#: The params sections this stage loads (noisydml.cli): every one but the tuning search (its tables name every kind
#: of run; the tuned runs' search settings are read from what their tune stages recorded)
SECTIONS = ("grid", "method_sets", "datasets", "noise", "noise_runs", "pretrain", "weights", "train", "methods",
            "evaluate", "chains", "tuned_runs", "tracking", "report", "timing", "figures")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.report import report

    return lambda params, args: report(params)


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, _load, SECTIONS)
