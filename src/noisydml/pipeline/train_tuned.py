"""The train_tuned stage: a tuned run (``<method>_tuned``, ``<chain>_tuned``) trained with the values its tune stage
chose (``tuning/<dataset>/<noise>/<name>/chosen.json``, a DVC dependency of the stage: the edge tune -> train).

Its own stage script (stages/train_tuned.py), so that only the tuned runs' stages run, and depend on, the tuning
code (:mod:`noisydml.tuning`); the training itself is the train stage's (:mod:`noisydml.pipeline.train`).
"""

from __future__ import annotations

from pathlib import Path

from noisydml import io
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.train import train_runs, train_with
from noisydml.runs import Run, find_runs, split_key, tuned_runs_of
from noisydml.tuning import value_at


def tuned_values(run: Run, layout: Layout) -> dict:
    """A tuned run's ``chosen.json``: ``values`` (space key -> value) and how they were chosen."""
    path = layout.root / run.chosen
    if not path.is_file():
        raise FileNotFoundError(f"{run.stage}: {run.chosen} is missing; `dvc repro` makes it first (stage "
                                f"tune@{run.dataset}-{run.noise}-{run.method})")
    return io.read_json(path)


def train_tuned(params: dict, run: Run, layout: Layout = Layout(), *, keep_checkpoint: bool = False) -> Path:
    """Train the tuned run ``run`` with its chosen values over its own overrides; its run.json records the values
    chosen, how, and the untuned run's values of the same keys (``tuned.untuned``, the report's "untuned ->
    chosen")."""
    run_params = run.params(params)
    chosen = tuned_values(run, layout)
    untuned = {key: value_at(run_params, split_key(run.method, key), key) for key in chosen["values"]}
    tuned = {"from": run.chosen, **chosen, "untuned": untuned}
    return train_with(run.params(params, chosen["values"]), run, layout, keep_checkpoint, tuned)


def run_from_arguments(params: dict, args) -> list[Path] | None:
    """Train the tuned runs ``--run-folder`` names: a seed folder of a tuned method, or a tuned chain's folder."""
    return train_runs(params, find_runs(tuned_runs_of(params), args.run_folder, "the tuned runs (tuning)"),
                      train_tuned)
