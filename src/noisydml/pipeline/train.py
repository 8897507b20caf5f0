"""The train stage: one method on one noisy dataset with one seed -> ``runs/<dataset>/<noise>/<method>/seed<k>``.

Everything written into the run folder is a function of params, data and code
(identical trainings give identical DVC hashes). What a run measured but must
not hash -- seconds per epoch, the MLflow run id, the epoch it resumed from --
goes to ``.runinfo/`` beside it, outside DVC's outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from noisydml import io
from noisydml.config import run_name
from noisydml.engine.trainer import RunSpec, Trainer
from noisydml.methods import check_method
from noisydml.models import check_backbone
from noisydml.pipeline.layout import EXPORTS, TRAIN_EMBEDDINGS, Layout
from noisydml.pipeline.rundata import load_run_data
from noisydml.reporting.plots import plot_history
from noisydml.tracking import MlflowTracker, git_commit


def train(params: dict, dataset: str, noise: str, method: str, seed: int, layout: Layout = Layout()) -> Path:
    """Train one run; write ``model.pt``, embeddings, ``history.csv``, ``run.json`` (and ``exports.npz``)."""
    hparams = check_method(params, method)
    check_backbone(params["train"])
    data = load_run_data(dataset, noise, layout, params["train"]["validation_classes"], seed)
    spec = RunSpec(method=method, method_hparams=hparams, train=params["train"], seed=seed,
                   data_fingerprint=data.fingerprint, evaluate=params["evaluate"])
    name = run_name(dataset, noise, method, seed)
    tracker = MlflowTracker(
        params["tracking"]["experiment"],
        name,
        params={
            "dataset": dataset, "noise": noise, "method": method, "seed": seed,
            "dataset_settings": params["datasets"][dataset], "noise_settings": params["noise"][noise],
            "method_hparams": hparams, "train": params["train"],
        },
        tags={"dvc_stage": f"train@{name}", "git_commit": git_commit(layout.root), "dataset": dataset,
              "noise": noise, "method": method, "seed": str(seed), "run_fingerprint": spec.fingerprint()},
    )
    checkpoint = layout.checkpoint(dataset, noise, method, seed)
    trainer = Trainer(spec, data.train_set, data.test_set, checkpoint, tracker=tracker, runtime=params["runtime"],
                      val_set=data.val_set, truth=data.truth, sample_ids=data.sample_ids)
    try:
        result = trainer.fit()
    except BaseException:
        tracker.end(status="KILLED")
        raise

    out = layout.run(dataset, noise, method, seed)
    history = pd.DataFrame(result.history)
    with io.atomic_dir(out) as tmp:
        torch.save({"model": result.model.state_dict(), "method": result.method.state_dict(),
                    "train": params["train"], "method_name": method}, tmp / "model.pt")
        np.savez(tmp / "test_embeddings.npz", embeddings=result.test_embeddings.numpy(),
                 labels=data.test_set.labels, sample_ids=data.test_rows["sample_id"].to_numpy())
        train_embeddings = result.train_embeddings.numpy()
        if data.val_index is not None:  # every training sample, in the split's order, held-out ones included
            train_embeddings = np.empty((len(data.train_rows), train_embeddings.shape[1]), np.float32)
            train_embeddings[data.fit_index] = result.train_embeddings.numpy()
            train_embeddings[data.val_index] = result.val_embeddings.numpy()
        np.savez(tmp / TRAIN_EMBEDDINGS, embeddings=train_embeddings,
                 sample_ids=data.train_rows["sample_id"].to_numpy(), labels=data.noisy["label"].to_numpy(),
                 true_labels=data.noisy["true_label"].to_numpy())
        if result.exports:
            np.savez(tmp / EXPORTS, sample_id=data.sample_ids, **result.exports)
        history.to_csv(tmp / "history.csv", index=False)
        plot_history(history, name, tmp / "training_curves.png")
        io.write_json(tmp / "run.json", {
            "run_name": name, "fingerprint": spec.fingerprint(), "epochs": params["train"]["epochs"],
            "selected_epoch": result.selected_epoch, "model_selection": params["train"]["model_selection"],
            "validation_classes": params["train"]["validation_classes"], "exports": sorted(result.exports),
            "environment": result.device,
        })
    io.write_json(layout.volatile(dataset, noise, method, seed), {
        "mlflow_run_id": result.run_id, "resumed_from_epoch": result.resumed_from_epoch,
        "epoch_seconds": result.epoch_seconds, "fingerprint": spec.fingerprint(),
    })
    tracker.log_artifact(out / "history.csv")
    tracker.log_artifact(out / "training_curves.png")
    tracker.end(status="FINISHED")
    checkpoint.unlink(missing_ok=True)  # the run is complete; runs/ holds the final model
    return out
