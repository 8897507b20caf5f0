"""DVC stage: fetch one dataset's files (data/raw/<dataset>); nothing for the embedded and folder datasets."""

from noisydml.cli import run_grid_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("grid", "datasets")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.download import download

    return download


if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), _load, SECTIONS)
