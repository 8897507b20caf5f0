"""The train stage: runs (:class:`noisydml.runs.Run`) -> ``runs/<dataset>/<noise>/<name>/seed<k>``.

Everything written into the run folder is a function of params, data and code
(identical trainings give identical DVC hashes). What a run measured but must
not hash -- seconds per epoch, the MLflow run id, the epoch it resumed from --
goes to ``.runinfo/`` beside it, outside DVC's outputs.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from noisydml import io
from noisydml.data.images import InputPipeline
from noisydml.data.registry import dataset_kind
from noisydml.engine import distributed
from noisydml.engine.embedding import embed
from noisydml.engine.types import RunSpec, TrainResult
from noisydml.pipeline.job import BuiltJob, build_job, fit
from noisydml.pipeline.layout import DECISIONS, EXPORTS, TRAIN_EMBEDDINGS, Layout
from noisydml.pipeline.rundata import load_run_data
from noisydml.runs import Run
from noisydml.schema import ParamsError
from noisydml.studies import find_study_runs
from noisydml.tracking import MlflowTracker, mlflow_experiment, mlflow_run_name, standard_tags

def train(params: dict, run: Run, layout: Layout = Layout(), *, keep_checkpoint: bool = False) -> Path:
    """Train ``run`` (a :class:`~noisydml.runs.Run` of params: the grid's, a chain's, a figure's) into its folder,
    with its own overrides of the method's hyper-parameters and of train. ``keep_checkpoint``: leave its last
    checkpoint in place (the stage trains more runs and removes them when all are written). A tuned run trains
    through :func:`noisydml.pipeline.train_tuned.train_tuned` (stages/train_tuned.py)."""
    if run.chosen is not None:
        raise ParamsError(f"{run.stage}: a tuned run trains with the values its tune stage chose "
                          "(noisydml.pipeline.train_tuned, stages/train_tuned.py), not with stages/train.py")
    return train_with(run.params(params), run, layout, keep_checkpoint)


def run_from_arguments(params: dict, args) -> list[Path] | None:
    """Train the runs ``--run-folder`` names (the stage's output, as dvc.yaml declares it): a seed folder
    ``runs/<dataset>/<noise>/<name>/seed<k>`` of the grid, or a chained run's folder ``runs/<dataset>/<noise>/<name>``
    (its seeds, one after another); with ``--study`` one of that study's own runs (only that study is imported)."""
    # before any relaunch: a stale stage fails at once
    return train_runs(params, find_study_runs(params, args.run_folder, args.study), train)


def train_runs(params: dict, runs: list[Run], train_one) -> list[Path] | None:
    """Train ``runs`` one after another with ``train_one(params, run, layout, keep_checkpoint=True)``.

    The runs' checkpoints stay until every run of the stage is written: DVC empties a stage's output before
    running it again, so a stage killed in its second seed resumes its first from the first's final checkpoint
    (no epoch re-trained) rather than from scratch.

    ``runtime.processes`` > 1: the stage starts itself again under ``torchrun`` as that many processes, which
    train each run together (:mod:`noisydml.engine.distributed`); rank 0 writes the run folders."""
    processes = params["runtime"]["processes"]
    if processes > 1 and not distributed.launched_by_torchrun():
        status = distributed.relaunch_under_torchrun(processes, sys.argv)
        if status:
            raise SystemExit(status)
        return None
    started_group = distributed.launched_by_torchrun() and not torch.distributed.is_initialized()
    distributed.init_from_environment(params["runtime"]["device"])
    layout, main = Layout(), distributed.current().is_main
    try:
        outs = [train_one(params, run, layout, keep_checkpoint=True) for run in runs]
    finally:
        if started_group:
            torch.distributed.destroy_process_group()
    if main:
        for run in runs:  # every run is complete; runs/ holds the final models
            layout.checkpoint(run.dataset, run.noise, run.name, run.seed).unlink(missing_ok=True)
    return outs


def train_with(params: dict, run: Run, layout: Layout, keep_checkpoint: bool, tuned: dict | None = None) -> Path:
    """Train one run (``params``: with the run's overrides; ``tuned``: a tuned run's chosen.json and its path,
    already applied); write ``model.pt``, embeddings, ``history.csv``, ``run.json`` (and ``exports.npz``)."""
    chain, main = run.chain, distributed.current().is_main
    data = load_run_data(run.dataset, run.noise, layout, params["train"]["validation_classes"], run.seed)
    upstream_dir = layout.run(chain["dataset"], chain["noise"], chain["upstream"], chain["seed"]) if chain else None
    checkpoint = layout.checkpoint(run.dataset, run.noise, run.name, run.seed)
    built = build_job(params, run.method, run.seed, data, layout, checkpoint,
                      tracker=_tracking_run(params, run, layout, tuned) if main else None, code=(__name__,),
                      where=f"chained run {run.run_name}", chain=chain, upstream_dir=upstream_dir)
    result = fit(built.job)
    out = layout.run(run.dataset, run.noise, run.name, run.seed)
    if not main:  # rank 0 writes the run folder and closes the MLflow run
        return out
    with io.atomic_dir(out) as tmp:
        _write_run_folder(tmp, params, run, built, result, tuned, layout)
    io.write_json(layout.volatile(run.dataset, run.noise, run.name, run.seed), {
        "mlflow_run_id": result.run_id, "resumed_from_epoch": result.resumed_from_epoch,
        "epoch_seconds": result.epoch_seconds, "fingerprint": built.job.spec.fingerprint(), "timeline": result.timeline,
    })
    built.job.tracker.log_artifact(out / "history.csv")
    built.job.tracker.end(status="FINISHED")
    if not keep_checkpoint:
        checkpoint.unlink(missing_ok=True)  # the run is complete; runs/ holds the final model
    return out


def _tracking_run(params: dict, run: Run, layout: Layout, tuned: dict | None):
    """``(spec, hparams) -> MlflowTracker``: the run's tracking run, its params and tags (rank 0 holds it)."""
    dataset, noise, method, seed, chain = run.dataset, run.noise, run.method, run.seed, run.chain

    def make(spec: RunSpec, hparams: dict) -> MlflowTracker:
        return MlflowTracker(
            mlflow_experiment(params, dataset),
            mlflow_run_name(run.name, noise, seed),
            params={
                "dataset": dataset, "noise": noise, "method": method, "seed": seed,
                "dataset_settings": params["datasets"][dataset], "noise_settings": params["noise"][noise],
                "method_hparams": hparams, "train": params["train"], "runtime": params["runtime"],
                "evaluate": params["evaluate"], **({"pretrain": params["pretrain"]} if params["train"]["pretrained"] ==
                                                   "embedded" else {}), **({"chain": chain} if chain else {}),
                **({"tuned": tuned["values"]} if tuned else {}),
            },
            tags={"dvc_stage": run.stage, "dataset": dataset, "noise": noise, "method": method, "run": run.name,
                  "seed": str(seed), "run_fingerprint": spec.fingerprint(), **standard_tags(layout.root),
                  **(_upstream_tags(spec, chain, layout) if chain else {})},
            root=layout.root,
        )

    return make


def _upstream_tags(spec: RunSpec, chain: dict, layout: Layout) -> dict[str, str]:
    """A chained run's tags naming its upstream: the upstream's fingerprint and its MLflow run (the id its train
    stage recorded; absent when the upstream went untracked or was trained elsewhere)."""
    info = layout.volatile(chain["dataset"], chain["noise"], chain["upstream"], chain["seed"])
    run_id = io.read_json(info).get("mlflow_run_id") if info.is_file() else None
    return {"upstream": spec.upstream["run"], **({"upstream_mlflow_run_id": run_id} if run_id else {})}


def _write_run_folder(folder: Path, params: dict, run: Run, built: BuiltJob, result: TrainResult,
                      tuned: dict | None, layout: Layout) -> None:
    """The run folder's files: the model, the test and training embeddings, the exports, the history, run.json."""
    data, spec = built.data, built.job.spec
    torch.save({"model": result.model.state_dict(), "method": result.method.state_dict(),
                "train": params["train"], "method_name": run.method}, folder / "model.pt")
    query = {} if data.test_set.query_mask is None else {"query_mask": data.test_set.query_mask}
    np.savez(folder / "test_embeddings.npz", embeddings=result.test_embeddings.numpy(),
             labels=data.test_set.labels, sample_ids=data.test_rows["sample_id"].to_numpy(), **query)
    np.savez(folder / TRAIN_EMBEDDINGS, embeddings=_every_training_embedding(params, run.seed, data, result),
             sample_ids=data.train_rows["sample_id"].to_numpy(), labels=data.noisy["label"].to_numpy(),
             true_labels=data.noisy["true_label"].to_numpy())
    if result.exports:
        np.savez(folder / EXPORTS, sample_id=data.sample_ids, **result.exports)
    decisions = per_sample_decisions(result.final_decisions)
    if decisions:  # the method's own per-sample decisions, row i = training sample sample_id[i]
        np.savez(folder / DECISIONS, sample_id=data.sample_ids, **decisions)
    prepared = layout.prepared(run.dataset)
    kind = dataset_kind(params["datasets"][run.dataset]["kind"])
    if kind.after_training:  # a face dataset: its verification images' features, scored by evaluate
        # imported by name: the dataset's code unit (code/training/<dataset>.json), not the train stage's
        importlib.import_module(kind.after_training).after_training(
            result.model, result.method.retrieval, params, run.seed, prepared, folder)
    pd.DataFrame(result.history).to_csv(folder / "history.csv", index=False)
    io.write_json(folder / "run.json", {
        "run_name": run.run_name, "method": run.method, "fingerprint": spec.fingerprint(),
        "epochs": params["train"]["epochs"], "selected_epoch": result.selected_epoch,
        "model_selection": params["train"]["model_selection"],
        "validation_classes": params["train"]["validation_classes"], "exports": sorted(result.exports),
        "trained_samples": int(len(data.sample_ids)), "upstream": built.upstream or None,
        **({"tuned": tuned} if tuned else {}),
        **({"decision_histograms": result.decision_histograms} if result.decision_histograms else {}),
        **({"pretrained": built.pretrained} if built.pretrained else {}),
        "environment": result.device,
    })


#: The per-sample fields of :class:`~noisydml.methods.base.Decisions` a run keeps (groups and drawn positives are
#: per-epoch draws, judged by the trainer, not kept).
DECISION_FIELDS = ("keep", "visits", "weights", "confidence", "pseudo_labels")


def per_sample_decisions(decisions) -> dict[str, np.ndarray]:
    """The fields of ``decisions`` (None: none) that the method filled, as arrays over its training rows."""
    if decisions is None:
        return {}
    return {name: np.asarray(getattr(decisions, name)) for name in DECISION_FIELDS
            if getattr(decisions, name) is not None}


def _every_training_embedding(params: dict, seed: int, data, result: TrainResult) -> np.ndarray:
    """Every training sample's embedding, in the split's order: the trained rows', the held-out classes' and those
    a chained run left out (embedded by the final model too)."""
    train_embeddings = np.empty((len(data.train_rows), result.train_embeddings.shape[1]), np.float32)
    position = pd.Series(np.arange(len(data.train_rows)), index=data.train_rows["sample_id"].to_numpy())
    train_embeddings[position[data.sample_ids].to_numpy()] = result.train_embeddings.numpy()
    others = np.setdiff1d(np.arange(len(data.train_rows)), position[data.sample_ids].to_numpy())
    if data.val_index is not None:
        train_embeddings[data.val_index] = result.val_embeddings.numpy()
        others = np.setdiff1d(others, data.val_index)
    if len(others):
        device = next(result.model.parameters()).device
        pipeline = InputPipeline.from_params(params["train"], params["runtime"], seed, device)
        train_embeddings[others] = embed(result.model, data.train_images[others], device, pipeline=pipeline).numpy()
    return train_embeddings
