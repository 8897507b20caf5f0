"""DVC stage: inject one noise setting into one dataset's training labels (data/noisy/<dataset>/<noise>)."""

from noisydml.cli import run_grid_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("grid", "noise", "noise_runs")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.corrupt import corrupt

    return corrupt


if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise"), _load, SECTIONS)
