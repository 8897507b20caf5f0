"""DVC stage: prepare one dataset (data/prepared/<dataset>)."""

from noisydml.cli import run_grid_stage


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.prepare import prepare

    return prepare


if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), _load)
