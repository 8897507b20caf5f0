"""DVC stage: audit every trained grid run of one dataset and noise setting for wrong labels
(audit/<dataset>/<noise>: per-sample scores, the detectors judged where the truth is known, a contact sheet)."""

from noisydml.cli import run_grid_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("grid", "figures", "noise_runs")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.audit import audit

    return audit


if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise"), _load, SECTIONS)
