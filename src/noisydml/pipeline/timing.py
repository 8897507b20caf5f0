"""The timing stage (opt-in): seconds per training epoch of one ``timing.entries`` method (PRISM's Table 4).

Every entry trains ``timing.epochs`` epochs from the same initial weights (the grid's pretrained backbone, if
any) on ``timing.noise``'s labels of ``timing.dataset``, with the grid's train settings and the entry's method
overrides (merged key by key, as every run's), no tracking, no checkpoint and no model selection. The first epoch
(allocations, empty memories) is left out of the mean when there are more.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from noisydml import io
from noisydml.engine.sampling import steps_per_epoch
from noisydml.pipeline.job import build_job, fit
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.rundata import load_run_data
from noisydml.runs import TIMING, Run


def timing_run(params: dict, entry: str) -> Run:
    """The run a ``timing.entries`` entry times: its method with its overrides (merged as every run's,
    :meth:`~noisydml.runs.Run.params`), the grid's train settings but ``timing.epochs``, no monitoring and no model
    selection (timing measures epochs, not models; no validation classes here), seed 0."""
    from noisydml.schema import ParamsError

    cfg = params["timing"]
    if entry not in cfg["entries"]:
        raise ParamsError(f"--entry {entry!r} is not in timing.entries ({', '.join(cfg['entries']) or 'none'})")
    item = cfg["entries"][entry]
    return Run(TIMING, entry, cfg["dataset"], cfg["noise"], entry, 0, item["method"], hparams=item["hparams"],
               train={"epochs": cfg["epochs"], "eval_every": 0, "model_selection": "last", "validation_classes": 0})


def timing(params: dict, entry: str, layout: Layout = Layout()) -> dict:
    cfg, run = params["timing"], timing_run(params, entry)
    item, run_params = cfg["entries"][entry], run.params(params)
    data = load_run_data(cfg["dataset"], cfg["noise"], layout)
    batch = run_params["train"]["batch"]
    steps = steps_per_epoch(len(data.train_set.labels), batch["classes"] * batch["per_class"])
    run_params["runtime"] = {**run_params["runtime"], "progress": False}
    with tempfile.TemporaryDirectory() as tmp:
        built = build_job(run_params, run.method, run.seed, data, layout, Path(tmp) / "last.pt", tracker=None,
                          code=(__name__,), where=f"timing.entries.{entry}")
        result = fit(built.job, stoppable=False)
    hparams = built.hparams
    counted = result.epoch_seconds[1:] or result.epoch_seconds
    row = {
        "entry": entry, "label": item["label"], "method": item["method"], "centres": hparams.get("centres"),
        "dataset": cfg["dataset"], "noise": cfg["noise"], "epochs": cfg["epochs"],
        "seconds_per_epoch": float(np.mean(counted)), "steps_per_epoch": steps,
        "seconds_per_step": float(np.mean(counted)) / steps, "epochs_counted": len(counted),
        "environment": result.device,
    }
    print(f"timing {cfg['dataset']}/{cfg['noise']}: {item['label']}: {row['seconds_per_epoch']:.2f} s/epoch")
    io.write_json(layout.timing(entry), row)
    return row
