"""The timing stage (opt-in): seconds per training epoch of one ``timing.entries`` method (PRISM's Table 4).

Every entry trains ``timing.epochs`` epochs from the same initial weights on
``timing.noise``'s labels of ``timing.dataset``, with the grid's train settings,
no tracking, no checkpoint and no model selection. The first epoch
(allocations, empty memories) is left out of the mean when there are more.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from noisydml import io
from noisydml.engine.trainer import NullTracker, RunSpec, Trainer, steps_per_epoch
from noisydml.methods import load_spec
from noisydml.models import check_backbone
from noisydml.pipeline.layout import Layout
from noisydml.pipeline.rundata import load_run_data


def timing(params: dict, entry: str, layout: Layout = Layout()) -> dict:
    cfg = params["timing"]
    if entry not in cfg["entries"]:
        from noisydml.schema import ParamsError

        raise ParamsError(f"--entry {entry!r} is not in timing.entries ({', '.join(cfg['entries']) or 'none'})")
    item = cfg["entries"][entry]
    check_backbone(params["train"], params["weights"])
    where = f"timing.entries.{entry}.hparams"
    hparams = load_spec(item["method"]).check({**params["methods"][item["method"]], **item["hparams"]}, where)
    data = load_run_data(cfg["dataset"], cfg["noise"], layout)
    # timing measures epochs, not models: no monitoring and no model selection (no validation classes here)
    train_cfg = {**params["train"], "epochs": cfg["epochs"], "eval_every": 0, "model_selection": "last",
                 "validation_classes": 0}
    batch = params["train"]["batch"]
    steps = steps_per_epoch(len(data.train_set.labels), batch["classes"] * batch["per_class"])
    spec = RunSpec(method=item["method"], method_hparams=hparams, train=train_cfg, seed=0,
                   data_fingerprint=data.fingerprint, evaluate=params["evaluate"])
    with tempfile.TemporaryDirectory() as tmp:
        result = Trainer(spec, data.train_set, data.test_set, Path(tmp) / "last.pt", tracker=NullTracker(),
                         runtime={**params["runtime"], "progress": False}, code=(__name__,)).fit()
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
