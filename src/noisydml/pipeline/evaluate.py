"""The evaluate stage: a run's test embeddings -> ``metrics/<dataset>/<noise>/<method>/seed<k>.json``."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.config import run_name
from noisydml.evaluation.retrieval import neighbours_used, retrieval_metrics
from noisydml.pipeline.layout import Layout
from noisydml.tracking import log_to_run


def evaluate(params: dict, dataset: str, noise: str, method: str, seed: int, layout: Layout = Layout(),
             log_to_mlflow: bool = True) -> dict:
    run = layout.run(dataset, noise, method, seed)
    if not (run / "test_embeddings.npz").is_file():
        raise FileNotFoundError(f"{run / 'test_embeddings.npz'}: missing; run the train stage first (dvc repro)")
    data = np.load(run / "test_embeddings.npz")
    cfg = params["evaluate"]
    t0 = time.perf_counter()
    metrics = retrieval_metrics(data["embeddings"], data["labels"], recall_at=cfg["recall_at"],
                                max_k=cfg["max_k"], nmi=cfg["nmi"], seed=seed)
    k_used, exact = neighbours_used(data["labels"], cfg["recall_at"], cfg["max_k"])
    seconds = time.perf_counter() - t0
    run_info = io.read_json(run / "run.json")
    history = pd.read_csv(run / "history.csv")
    # per-epoch scores of the method's decisions (selection precision/recall, weights, pseudo-labels)
    training = {}
    for column in (c for c in history.columns if c.startswith("diag_")):
        if history[column].notna().any():
            training[column] = [None if pd.isna(v) else float(v) for v in history[column]]
            training[f"final_{column}"] = training[column][-1]
    result = {
        "dataset": dataset, "noise": noise, "method": method, "seed": seed,
        "num_queries": int(len(data["labels"])), "num_classes": int(len(np.unique(data["labels"]))),
        "metrics": metrics, "training": training, "k_used": k_used, "map_at_r_exact": exact,
        "selected_epoch": run_info.get("selected_epoch"), "model_selection": run_info.get("model_selection"),
    }
    out = layout.metrics(dataset, noise, method, seed)
    io.write_json(out, result)
    if not exact:
        print(f"warning: evaluate.max_k = {cfg['max_k']} is below the largest test class - 1 "
              f"({k_used} neighbours used): MAP@R and R-Precision are underestimates (map_at_r_exact: false)")
    if log_to_mlflow:
        volatile = layout.volatile(dataset, noise, method, seed)
        info = io.read_json(volatile) if volatile.is_file() else {}
        if info.get("fingerprint") not in (None, run_info.get("fingerprint")):
            info = {}  # the run info of another training of this run
        log_to_run(info.get("mlflow_run_id"), {f"final_{k}": v for k, v in metrics.items()}, [out])
    print(f"evaluate {run_name(dataset, noise, method, seed)} in {seconds:.1f}s: "
          + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return result


def evaluate_chain(params: dict, key: str, layout: Layout = Layout(), log_to_mlflow: bool = True) -> dict:
    """Evaluate the chained run ``chains.<key>`` (``evaluate_chain@<key>``)."""
    c = params["chains"][key]
    return evaluate(params, c["dataset"], c["noise"], c["name"], c["seed"], layout, log_to_mlflow)
