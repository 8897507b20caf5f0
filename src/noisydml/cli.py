"""Shared argument handling for ``stages/*.py``: load params, pin the numerics, turn known errors into clean exits.

A stage script imports its pipeline code inside the ``load`` function it hands to :func:`run_stage`, never at the
top: ``load`` runs after :func:`noisydml.numerics.pin` has set the environment the numeric libraries read when
they load, and returns the stage's work.

A stage script names the params sections it loads (``SECTIONS``): those its dvc.yaml stages declare, and those it
only names things from (the grid, to refuse an item it does not list; tracking, for MLflow). Only those are
validated and readable (:func:`noisydml.config.load_params`); tests/test_dependencies.py checks the list against
dvc.yaml and the stage's code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from noisydml import numerics
from noisydml.config import load_params
from noisydml.data import DatasetError
from noisydml.runtime import STAGE_STARTED
from noisydml.schema import SECTION_OWNERS, ParamsError


def _process_start() -> float:
    """When this process started (so the record includes interpreter start-up and imports), or the moment a
    launcher started the stage in a process it keeps."""
    if os.environ.get(STAGE_STARTED):
        return float(os.environ[STAGE_STARTED])
    try:
        import psutil

        return psutil.Process(os.getpid()).create_time()
    except Exception:  # noqa: BLE001 - a timing record must never fail a stage
        return time.time()


def _record_timing(name: str, started: float, body_start: float, runtime: dict, taken: dict) -> None:
    """``.runinfo/stages/<name>.json``: where this stage process's time went (``scripts/pipeline_breakdown.py``)
    and the host it ran on (its fingerprint's id; the whole fingerprint in ``.runinfo/hosts/<id>.json``).

    Outside DVC's outputs and git: seconds and hosts are volatile."""
    try:
        host = numerics.host_fingerprint(runtime)
        root = Path(".runinfo")
        (root / "hosts").mkdir(parents=True, exist_ok=True)
        (root / "hosts" / f"{host['id']}.json").write_text(json.dumps(host, indent=1) + "\n")
        path = root / "stages" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        end = time.time()
        path.write_text(json.dumps({"stage": name, "process_start": started, "body_start": body_start,
                                    "end": end, "startup_seconds": body_start - started,
                                    "wall_seconds": end - started, "host": host["id"],
                                    "numerics": runtime["numerics"], "threads": runtime["threads"],
                                    "code_paths": taken}) + "\n")
    except OSError:
        pass


def run_stage(description: str, add_args: Callable[[argparse.ArgumentParser], None],
              load: Callable[[], Callable[[dict, argparse.Namespace], object]], sections: tuple[str, ...] | None) -> None:
    """Parse the options, load and validate the params ``sections`` (and ``runtime``; None: every section), pin ``runtime.numerics``,
    then ``load()`` (which imports the pipeline code and returns the work) and run the work on ``(params, args)``."""
    started = _process_start()
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    add_args(parser)
    args = parser.parse_args()
    stage = Path(sys.argv[0]).stem
    name = "@".join([stage, "-".join(str(v) for k, v in vars(args).items() if k != "params" and v is not None)])
    try:
        params = load_params(args.params, None if sections is None else ("runtime", *sections))
        numerics.pin(params["runtime"])
        work = load()
        # the libraries took the pinned code paths, before any work and again after it (the work may load more)
        numerics.verify(params["runtime"])
        body_start = time.time()
        work(params, args)
        taken = numerics.verify(params["runtime"])
        _record_timing(name.rstrip("@"), started, body_start, params["runtime"], taken)
    except (ParamsError, numerics.NumericsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (FileNotFoundError, DatasetError) as e:
        # Known, user-facing problems (missing inputs, bad data files): the message says what to do.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def run_grid_stage(description: str, keys: tuple[str, ...], load: Callable[[], Callable],
                   sections: tuple[str, ...]) -> None:
    """A stage for one item of the grid: ``--dataset/--noise/--method/--seed`` (those in ``keys``),
    checked against params.yaml's grid, then ``work(params, dataset=..., ...)`` with ``work = load()``."""

    if "grid" not in sections:
        raise ValueError("run_grid_stage: the stage's SECTIONS must name 'grid' (its item is checked against it)")
    # the grid section's module, loaded by name as every section's owner is (a stage's code unit holds the owners
    # of its SECTIONS): the stages without a grid item do not run it
    grid = importlib.import_module(SECTION_OWNERS["grid"])

    def add_args(parser):
        for key in keys:
            parser.add_argument(f"--{key}", type=grid.GRID_KEYS[key][1], required=True)

    def load_item():
        work = load()

        def run_item(params, args):
            item = {key: getattr(args, key) for key in keys}
            grid.check_in_grid(params, **item)
            work(params, **item)

        return run_item

    run_stage(description, add_args, load_item, sections)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The train stage's option: the run, named by its folder (as dvc.yaml declares the stage's output)."""
    # not --run: torchrun (runtime.processes > 1) reads the relaunched command line and takes --run for its --run-path
    parser.add_argument("--run-folder", required=True,
                        help="runs/<dataset>/<noise>/<name>/seed<k>: a run of params.yaml (noisydml.runs) -- the "
                             "grid's or a chain's")
    parser.add_argument("--study", help="a study of noisydml.studies whose own run --run-folder is (its ablations, cells...)")
