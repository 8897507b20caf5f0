"""The train stage: one method on one noisy dataset with one seed -> ``runs/<dataset>/<noise>/<method>/seed<k>``.

Everything written into the run folder is a function of params, data and code
(identical trainings give identical DVC hashes). What a run measured but must
not hash -- seconds per epoch, the MLflow run id, the epoch it resumed from --
goes to ``.runinfo/`` beside it, outside DVC's outputs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from noisydml import io
from noisydml.config import (
    bspml_cell_run, chain_train_section, check_in_grid, embedding_size_run, run_name, sgps_ablation_run,
)
from noisydml.data.images import InputPipeline
from noisydml.data.prepared import sha256_file
from noisydml.engine import distributed
from noisydml.engine.trainer import NullTracker, RunSpec, Trainer, embed
from noisydml.methods import check_frozen_backbone, check_method
from noisydml.models import check_backbone
from noisydml.pipeline.layout import EXPORTS, TRAIN_EMBEDDINGS, Layout
from noisydml.pipeline.pretrained import load_pretrained
from noisydml.pipeline.rundata import load_run_data, take_upstream
from noisydml.schema import ParamsError
from noisydml.tracking import MlflowTracker, git_commit


def train(params: dict, dataset: str, noise: str, method: str, seed: int, layout: Layout = Layout()) -> Path:
    """Train one run of the grid (``train@<dataset>-<noise>-<method>-<seed>``)."""
    return _train(params, dataset, noise, method, seed, method, None, layout, f"train@{run_name(dataset, noise, method, seed)}")


def train_chain(params: dict, key: str, layout: Layout = Layout()) -> Path:
    """Train the chained run ``chains.<key>`` (``train_chain@<key>``) from its upstream's folder."""
    if key not in params["chains"]:
        raise ParamsError(f"--chain {key!r} is not in chains ({', '.join(params['chains']) or 'none'})")
    c = params["chains"][key]
    # the chain's own overrides: of the method's hyper-parameters and of a few train keys (validated by config)
    chained = {**params, "train": chain_train_section(params["train"], c),
               "methods": {**params["methods"], c["method"]: {**params["methods"][c["method"]], **c["hparams"]}}}
    return _train(chained, c["dataset"], c["noise"], c["method"], c["seed"], c["name"], c, layout, f"train_chain@{key}")


def train_embedding_size(params: dict, method: str, dim: int, seed: int, layout: Layout = Layout()) -> Path:
    """Train one point of ``figures.embedding_size`` (BSPML Fig. 5; ``train_embedding_size@<method>-<dim>-<seed>``):
    ``method`` with ``train.embedding_dim = dim`` on the figure's dataset and noise, into
    ``runs/<dataset>/<noise>/<method>_dim<dim>/seed<k>``. Every other setting is the grid's."""
    sizes = params["figures"]["embedding_size"]
    if method not in sizes["methods"] or dim not in sizes["dims"] or seed not in sizes["seeds"]:
        raise ParamsError(f"--method {method} --embedding-dim {dim} --seed {seed} is not a point of "
                          f"figures.embedding_size (methods {sizes['methods']}, dims {sizes['dims']}, "
                          f"seeds {sizes['seeds']})")
    point = {**params, "train": {**params["train"], "embedding_dim": dim}}
    return _train(point, sizes["dataset"], sizes["noise"], method, seed, embedding_size_run(method, dim), None, layout,
                  f"train_embedding_size@{method}-{dim}-{seed}")


def train_bspml_cell(params: dict, lam: str, mu: str, seed: int, layout: Layout = Layout()) -> Path:
    """Train one cell of ``figures.bspml_cells`` (BSPML Figs. 3-4; ``train_bspml_cell@<lambda>-<mu>-<seed>``):
    ``bspml`` with the age held at lambda (``lambda_0 = lambda_inf = lambda``, ``age_multiplier = 1``, so the
    axis means one thing) and the balance weight ``mu``, into ``runs/<dataset>/<noise>/bspml_lam<l>_mu<m>/seed<k>``.
    ``lam`` and ``mu`` are the values as written in params.yaml (they name the run's folder)."""
    cells = params["figures"]["bspml_cells"]
    if lam not in cells["lambda_names"] or mu not in cells["mu_names"] or seed not in cells["seeds"]:
        raise ParamsError(f"--lam {lam} --mu {mu} --seed {seed} is not a cell of figures.bspml_cells (lambdas "
                          f"{cells['lambda_names']}, mus {cells['mu_names']}, seeds {cells['seeds']})")
    age = cells["lambdas"][cells["lambda_names"].index(lam)]
    balance = cells["mus"][cells["mu_names"].index(mu)]
    hparams = {**params["methods"]["bspml"], "lambda_0": age, "lambda_inf": age, "age_multiplier": 1.0, "mu": balance}
    cell = {**params, "methods": {**params["methods"], "bspml": hparams}}
    return _train(cell, cells["dataset"], cells["noise"], "bspml", seed, bspml_cell_run(lam, mu), None, layout,
                  f"train_bspml_cell@{lam}-{mu}-{seed}")


def train_sgps_ablation(params: dict, variant: str, seed: int, layout: Layout = Layout()) -> Path:
    """Train one variant of ``figures.sgps_ablations`` (SGPS Fig. 5, Table V; ``train_sgps_ablation@<variant>-<seed>``):
    ``sgps`` with the variant's overrides on the figure's dataset and noise, into ``runs/<d>/<n>/sgps_<variant>``."""
    ablations = params["figures"]["sgps_ablations"]
    if variant not in ablations["train"] or seed not in ablations["seeds"]:
        raise ParamsError(f"--sgps-ablation {variant} --seed {seed} is not a run of figures.sgps_ablations (train "
                          f"{ablations['train']}, seeds {ablations['seeds']})")
    hparams = {**params["methods"]["sgps"], **ablations["variants"][variant]["hparams"]}
    for key in ("sgm", "transproto"):  # nested sections merge key by key
        if key in ablations["variants"][variant]["hparams"]:
            hparams[key] = {**params["methods"]["sgps"].get(key, {}), **ablations["variants"][variant]["hparams"][key]}
    run = {**params, "methods": {**params["methods"], "sgps": hparams}}
    return _train(run, ablations["dataset"], ablations["noise"], "sgps", seed, sgps_ablation_run(variant), None,
                  layout, f"train_sgps_ablation@{variant}-{seed}")


def run_from_arguments(params: dict, args) -> Path | None:
    """Train what the options name (:func:`noisydml.cli.add_train_arguments`), refusing mixed or incomplete options.

    ``runtime.processes`` > 1: the stage starts itself again under ``torchrun`` as that many processes, which
    train the run together (:mod:`noisydml.engine.distributed`); rank 0 writes the run folder."""
    processes = params["runtime"]["processes"]
    if processes > 1 and not distributed.launched_by_torchrun():
        status = distributed.relaunch_under_torchrun(processes, sys.argv)
        if status:
            raise SystemExit(status)
        return None
    started_group = distributed.launched_by_torchrun() and not torch.distributed.is_initialized()
    distributed.init_from_environment(params["runtime"]["device"])
    try:
        return _run_named(params, args)
    finally:
        if started_group:
            torch.distributed.destroy_process_group()


def _run_named(params: dict, args) -> Path:
    given = {k for k in ("dataset", "noise", "method", "seed", "chain", "embedding_dim", "lam", "mu", "sgps_ablation")
             if getattr(args, k) is not None}
    flag = {k: "--" + k.replace("_", "-") for k in given}
    modes = [("chain", {"chain"}), ("embedding_dim", {"embedding_dim", "method", "seed"}),
             ("lam", {"lam", "mu", "seed"}), ("sgps_ablation", {"sgps_ablation", "seed"}),
             ("dataset", {"dataset", "noise", "method", "seed"})]
    for key, needs in modes:
        if key in given:
            extra, missing = given - needs, needs - given
            if extra or missing:
                raise ParamsError(f"{flag[key]} takes {' '.join(sorted('--' + n.replace('_', '-') for n in needs))}"
                                  + (f"; drop {', '.join(sorted(flag[e] for e in extra))}" if extra else "")
                                  + (f"; missing {', '.join(sorted('--' + m.replace('_', '-') for m in missing))}"
                                     if missing else ""))
            if key == "chain":
                return train_chain(params, args.chain)
            if key == "embedding_dim":
                return train_embedding_size(params, args.method, args.embedding_dim, args.seed)
            if key == "lam":
                return train_bspml_cell(params, args.lam, args.mu, args.seed)
            if key == "sgps_ablation":
                return train_sgps_ablation(params, args.sgps_ablation, args.seed)
            check_in_grid(params, dataset=args.dataset, noise=args.noise, method=args.method, seed=args.seed)
            return train(params, args.dataset, args.noise, args.method, args.seed)
    raise ParamsError("name a run: --dataset --noise --method --seed (a grid run), --chain KEY, "
                      "--method --embedding-dim --seed (figures.embedding_size), --lam --mu --seed "
                      "(figures.bspml_cells) or --sgps-ablation --seed (figures.sgps_ablations)")


def _upstream(chain: dict, data, layout: Layout, key_where: str):
    """What a chained run takes from its upstream: data (labels, kept samples), inputs, initial state."""
    upstream_dir = layout.run(chain["dataset"], chain["noise"], chain["upstream"], chain["seed"])
    if not (upstream_dir / "model.pt").is_file():
        raise FileNotFoundError(f"{key_where}: the upstream run {upstream_dir} is not trained yet; `dvc repro` "
                                "trains it first (the chain's stage depends on it)")
    data, inputs, exports_sha = take_upstream(data, upstream_dir, chain["labels"], chain["inputs"], key_where)
    init_state = None
    if chain["init"]["model"] or chain["init"]["method"]:
        saved = torch.load(upstream_dir / "model.pt", map_location="cpu", weights_only=False)
        init_state = {"model": saved["model"] if chain["init"]["model"] else None,
                      "method": saved["method"] if chain["init"]["method"] else None}
    upstream = {"run": str(upstream_dir.relative_to(layout.root)), "model_sha256": sha256_file(upstream_dir / "model.pt"),
                "exports_sha256": exports_sha, "init": chain["init"], "labels": chain["labels"], "inputs": chain["inputs"]}
    return data, inputs, init_state, upstream


def _train(params: dict, dataset: str, noise: str, method: str, seed: int, name_in_grid: str, chain: dict | None,
           layout: Layout, stage: str) -> Path:
    """Train one run; write ``model.pt``, embeddings, ``history.csv``, ``run.json`` (and ``exports.npz``).
    ``stage`` is the DVC stage that trains it (an MLflow tag)."""
    hparams = check_method(params, method)
    check_backbone(params["train"], params["weights"])
    check_frozen_backbone(hparams, params["train"], f"methods.{method}")
    data = load_run_data(dataset, noise, layout, params["train"]["validation_classes"], seed)
    inputs, init_state, upstream = {}, None, {}
    name = run_name(dataset, noise, name_in_grid, seed)
    if chain is not None:
        data, inputs, init_state, upstream = _upstream(chain, data, layout, f"chained run {name}")
    backbone_state, pretrained = load_pretrained(params, layout)
    spec = RunSpec(method=method, method_hparams=hparams, train=params["train"], seed=seed,
                   data_fingerprint=data.fingerprint, evaluate=params["evaluate"], upstream=upstream,
                   pretrained=pretrained)
    main = distributed.current().is_main
    tracker = NullTracker() if not main else MlflowTracker(
        params["tracking"]["experiment"],
        name,
        params={
            "dataset": dataset, "noise": noise, "method": method, "seed": seed,
            "dataset_settings": params["datasets"][dataset], "noise_settings": params["noise"][noise],
            "method_hparams": hparams, "train": params["train"], **({"chain": chain} if chain else {}),
        },
        tags={"dvc_stage": stage, "git_commit": git_commit(layout.root),
              "dataset": dataset, "noise": noise, "method": method, "seed": str(seed),
              "run_fingerprint": spec.fingerprint(), **({"upstream": upstream["run"]} if chain else {})},
    )
    checkpoint = layout.checkpoint(dataset, noise, name_in_grid, seed)
    # NOISYDML_STOP_AFTER_EPOCH=k stops the run after epoch k's checkpoint, as a kill would (tests of resume)
    stop = os.environ.get("NOISYDML_STOP_AFTER_EPOCH")
    trainer = Trainer(spec, data.train_set, data.test_set, checkpoint, tracker=tracker, runtime=params["runtime"],
                      val_set=data.val_set, truth=data.truth, sample_ids=data.sample_ids, inputs=inputs,
                      init_state=init_state, stop_after_epoch=int(stop) if stop else None,
                      backbone_state=backbone_state)
    try:
        result = trainer.fit()
    except BaseException:
        tracker.end(status="KILLED")
        raise

    out = layout.run(dataset, noise, name_in_grid, seed)
    if not main:  # rank 0 writes the run folder and closes the MLflow run
        return out
    history = pd.DataFrame(result.history)
    with io.atomic_dir(out) as tmp:
        torch.save({"model": result.model.state_dict(), "method": result.method.state_dict(),
                    "train": params["train"], "method_name": method}, tmp / "model.pt")
        query = {} if data.test_set.query_mask is None else {"query_mask": data.test_set.query_mask}
        np.savez(tmp / "test_embeddings.npz", embeddings=result.test_embeddings.numpy(),
                 labels=data.test_set.labels, sample_ids=data.test_rows["sample_id"].to_numpy(), **query)
        # every training sample, in the split's order (held-out and chain-excluded ones included)
        train_embeddings = np.empty((len(data.train_rows), result.train_embeddings.shape[1]), np.float32)
        position = pd.Series(np.arange(len(data.train_rows)), index=data.train_rows["sample_id"].to_numpy())
        train_embeddings[position[data.sample_ids].to_numpy()] = result.train_embeddings.numpy()
        others = np.setdiff1d(np.arange(len(data.train_rows)), position[data.sample_ids].to_numpy())
        if data.val_index is not None:
            train_embeddings[data.val_index] = result.val_embeddings.numpy()
            others = np.setdiff1d(others, data.val_index)
        if len(others):  # samples a chained run left out: embedded by the final model too
            device = next(result.model.parameters()).device
            pipeline = InputPipeline.from_params(params["train"], params["runtime"], seed, device)
            train_embeddings[others] = embed(result.model, data.train_images[others], device,
                                             pipeline=pipeline).numpy()
        np.savez(tmp / TRAIN_EMBEDDINGS, embeddings=train_embeddings,
                 sample_ids=data.train_rows["sample_id"].to_numpy(), labels=data.noisy["label"].to_numpy(),
                 true_labels=data.noisy["true_label"].to_numpy())
        if result.exports:
            np.savez(tmp / EXPORTS, sample_id=data.sample_ids, **result.exports)
        history.to_csv(tmp / "history.csv", index=False)
        io.write_json(tmp / "run.json", {
            "run_name": name, "method": method, "fingerprint": spec.fingerprint(), "epochs": params["train"]["epochs"],
            "selected_epoch": result.selected_epoch, "model_selection": params["train"]["model_selection"],
            "validation_classes": params["train"]["validation_classes"], "exports": sorted(result.exports),
            "trained_samples": int(len(data.sample_ids)), "upstream": upstream or None,
            **({"decision_histograms": result.decision_histograms} if result.decision_histograms else {}),
            **({"pretrained": pretrained} if pretrained else {}),
            "environment": result.device,
        })
    io.write_json(layout.volatile(dataset, noise, name_in_grid, seed), {
        "mlflow_run_id": result.run_id, "resumed_from_epoch": result.resumed_from_epoch,
        "epoch_seconds": result.epoch_seconds, "fingerprint": spec.fingerprint(),
    })
    tracker.log_artifact(out / "history.csv")
    tracker.end(status="FINISHED")
    checkpoint.unlink(missing_ok=True)  # the run is complete; runs/ holds the final model
    return out
