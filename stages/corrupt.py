"""DVC stage: inject one noise setting into one dataset's training labels (data/noisy/<dataset>/<noise>)."""

from noisydml.cli import run_grid_stage


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.corrupt import corrupt

    return corrupt


if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset", "noise"), _load)
