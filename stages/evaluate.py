"""DVC stage: retrieval metrics of every run of one dataset, grid and chained runs
(metrics/<dataset>/<noise>/<run>/seed<k>.json); runs whose inputs did not change keep their metrics."""

from noisydml.cli import run_grid_stage

#: The params sections this stage loads (noisydml.cli; tests/test_dependencies.py checks them against dvc.yaml)
SECTIONS = ("grid", "evaluate", "chains", "tuned_runs", "figures", "tracking", "methods", "train")


def _load():
    # imported here, not at the top: run_stage has pinned runtime.numerics before the numeric libraries load
    from noisydml.pipeline.evaluate import evaluate

    return evaluate


if __name__ == "__main__":
    run_grid_stage(__doc__, ("dataset",), _load, SECTIONS)
