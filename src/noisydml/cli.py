"""Shared argument handling for ``stages/*.py``: load params, turn known errors into clean exits."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from noisydml.config import GRID_KEYS, check_in_grid, load_params
from noisydml.data import DatasetError
from noisydml.schema import ParamsError


def _process_start() -> float:
    """When this process started (so the record includes interpreter start-up and imports)."""
    try:
        import psutil

        return psutil.Process(os.getpid()).create_time()
    except Exception:  # noqa: BLE001 - a timing record must never fail a stage
        return time.time()


def _record_timing(name: str, started: float, body_start: float) -> None:
    """``.runinfo/stages/<name>.json``: where this stage process's time went (``scripts/pipeline_breakdown.py``).

    Outside DVC's outputs and git: seconds are volatile."""
    try:
        path = Path(".runinfo") / "stages" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        end = time.time()
        path.write_text(json.dumps({"stage": name, "process_start": started, "body_start": body_start,
                                    "end": end, "startup_seconds": body_start - started,
                                    "wall_seconds": end - started}) + "\n")
    except OSError:
        pass


def run_stage(description: str, add_args: Callable[[argparse.ArgumentParser], None], body: Callable) -> None:
    started = _process_start()
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    add_args(parser)
    args = parser.parse_args()
    stage = Path(sys.argv[0]).stem
    name = "@".join([stage, "-".join(str(v) for k, v in vars(args).items() if k != "params" and v is not None)])
    try:
        params = load_params(args.params)
        body_start = time.time()
        body(params, args)
        _record_timing(name.rstrip("@"), started, body_start)
    except ParamsError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (FileNotFoundError, DatasetError) as e:
        # Known, user-facing problems (missing inputs, bad data files): the message says what to do.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def run_grid_stage(description: str, keys: tuple[str, ...], work: Callable) -> None:
    """A stage for one item of the grid: ``--dataset/--noise/--method/--seed`` (those in ``keys``),
    checked against params.yaml's grid, then ``work(params, dataset=..., ...)``."""

    def add_args(parser):
        for key in keys:
            parser.add_argument(f"--{key}", type=GRID_KEYS[key][1], required=True)

    def body(params, args):
        item = {key: getattr(args, key) for key in keys}
        check_in_grid(params, **item)
        work(params, **item)

    run_stage(description, add_args, body)
