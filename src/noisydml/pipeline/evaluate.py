"""The evaluate stage, one per dataset: every run's test embeddings -> ``metrics/<dataset>/...``.

One process evaluates all runs of a dataset (the grid's and the chained ones): process start-up (torch,
faiss, pytorch-metric-learning, MLflow) is paid once, not once per run. The stage's output folder is
persistent: a run whose inputs (test embeddings, history, run.json) and ``evaluate`` params are unchanged
keeps its metrics file, so adding a method evaluates only the new runs. Each metrics file records the
digest of its inputs. A face run (its dataset has verification sets) also gets the verification protocols'
numbers (:mod:`noisydml.pipeline.face_eval`) from the features its train stage kept. The stage also draws each run's training curves and logs the final
metrics to the run's MLflow run (best effort).
"""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import pandas as pd
from tqdm import tqdm

from noisydml import io
from noisydml.runs import chain_runs, run_name
from noisydml.studies import all_runs
from noisydml.engine.judge import group_majorities
from noisydml.evaluation.per_class import per_class_precision_at_1
from noisydml.evaluation.retrieval import neighbours_used, retrieval_metrics
from noisydml.pipeline.face_eval import verification_metrics
from noisydml.pipeline.face_features import VERIFICATION_EMBEDDINGS
from noisydml.pipeline.layout import Layout
from noisydml.reporting.plots import plot_history


#: Bumped when a metrics file gains or changes content: every run is evaluated again once.
METRICS_FORMAT = 4  # 4: per-class P@1 counts (the reports' bootstrap over test classes)


def inputs_digest(params: dict, run) -> str:
    """sha256 of what a run's metrics are computed from: its test embeddings, history, run.json, evaluate params
    (and the metrics file's format)."""
    digest = hashlib.sha256(json.dumps({**params["evaluate"], "format": METRICS_FORMAT}, sort_keys=True).encode())
    for name in ("test_embeddings.npz", "history.csv", "run.json"):
        digest.update(name.encode() + (run / name).read_bytes())
    if (run / VERIFICATION_EMBEDDINGS).is_file():  # a face run (runs of other datasets keep their digests)
        digest.update(VERIFICATION_EMBEDDINGS.encode() + (run / VERIFICATION_EMBEDDINGS).read_bytes())
    return digest.hexdigest()


def cluster_label_quality(params: dict, dataset: str, noise: str, name: str, seed: int, layout: Layout) -> dict:
    """For a chained run trained on its upstream's cluster labels (``labels.kind: clusters``, e.g. SGPS's c^B):
    how many clusters it kept, their purity (kept rows in their cluster's majority true class) and coverage (the
    share of the upstream's rows kept), from the upstream's exports and the true labels of its training rows."""
    chain = next((r.chain for r in chain_runs(params) if (r.dataset, r.noise, r.name, r.seed) ==
                  (dataset, noise, name, seed) and r.chain["labels"]["kind"] == "clusters"), None)
    if chain is None:
        return {}
    upstream = layout.run(dataset, noise, chain["upstream"], seed)
    exported = np.load(upstream / "exports.npz")
    rows = np.load(upstream / "train_embeddings.npz")
    true_of = pd.Series(rows["true_labels"], index=rows["sample_ids"])
    clusters = exported[chain["labels"]["label"]]
    kept = exported[chain["labels"]["keep"]] > 0.5 if chain["labels"]["keep"] else np.ones(len(clusters), bool)
    true = true_of.loc[exported["sample_id"]].to_numpy()
    _, majority_rows = group_majorities(clusters[kept], true[kept])
    return {"clusters": int(len(np.unique(clusters[kept]))),
            "purity": float(majority_rows.sum() / max(int(kept.sum()), 1)), "coverage": float(kept.mean())}


def evaluate_run(params: dict, dataset: str, noise: str, name: str, seed: int, layout: Layout = Layout()) -> dict:
    """Metrics of one run: ``metrics/<dataset>/<noise>/<name>/seed<k>.json`` and its training curves."""
    run = layout.run(dataset, noise, name, seed)
    if not (run / "test_embeddings.npz").is_file():
        raise FileNotFoundError(f"{run / 'test_embeddings.npz'}: missing; run the train stage first (dvc repro)")
    data = np.load(run / "test_embeddings.npz")
    cfg = params["evaluate"]
    # In-Shop's protocol: queries against a gallery; otherwise every test row queries all the others
    query_mask = data["query_mask"] if "query_mask" in data.files else None
    metrics = retrieval_metrics(data["embeddings"], data["labels"], recall_at=cfg["recall_at"],
                                max_k=cfg["max_k"], nmi=cfg["nmi"], seed=seed, query_mask=query_mask,
                                device=cfg["device"])
    # per test class: queries and nearest-neighbour hits (what the report's bootstrap over classes resamples)
    per_class = per_class_precision_at_1(data["embeddings"], data["labels"], cfg["recall_at"], cfg["max_k"],
                                         query_mask, expected=metrics["precision_at_1"])
    if (run / VERIFICATION_EMBEDDINGS).is_file():  # a face run: the verification protocols, beside retrieval
        with np.load(run / VERIFICATION_EMBEDDINGS) as saved:
            metrics.update(verification_metrics(dict(saved), layout.prepared(dataset), cfg["tar_reading"]))
    k_used, exact = neighbours_used(data["labels"], cfg["recall_at"], cfg["max_k"], query_mask)
    run_info = io.read_json(run / "run.json")
    history = pd.read_csv(run / "history.csv")
    # per-epoch scores of the method's decisions (selection precision/recall, weights, pseudo-labels)
    training = {}
    for column in (c for c in history.columns if c.startswith("diag_")):
        if history[column].notna().any():
            training[column] = [None if pd.isna(v) else float(v) for v in history[column]]
            training[f"final_{column}"] = training[column][-1]
    # the monitoring curves (test / validation metrics every train.eval_every epochs; None in between)
    for column in (c for c in history.columns if c.startswith(("test_", "val_"))):
        training[f"curve_{column}"] = [None if pd.isna(v) else float(v) for v in history[column]]
    # the final value of everything the method logged (e.g. BSPML's MAW / SDAW, PRISM's threshold)
    logged = [c for c in history.columns if c != "epoch" and not c.startswith(("test_", "val_", "diag_"))]
    training["final_logged"] = {c: float(history[c].dropna().iloc[-1]) for c in logged
                                if pd.api.types.is_numeric_dtype(history[c]) and history[c].notna().any()}
    # clean vs noisy histograms of the final weights / confidences (the trainer's, from ground truth)
    for decision, histogram in run_info.get("decision_histograms", {}).items():
        training[f"histogram_{decision}"] = histogram
    quality = cluster_label_quality(params, dataset, noise, name, seed, layout)
    result = {
        **({"pseudo_labels": quality} if quality else {}),
        "dataset": dataset, "noise": noise, "method": name, "seed": seed,
        "num_queries": int(len(data["labels"]) if query_mask is None else query_mask.sum()),
        **({"num_gallery": int((~query_mask).sum())} if query_mask is not None else {}),
        "num_classes": int(len(np.unique(data["labels"]))),
        "metrics": metrics, "per_class_precision_at_1": per_class, "training": training, "k_used": k_used, "map_at_r_exact": exact,
        "selected_epoch": run_info.get("selected_epoch"), "model_selection": run_info.get("model_selection"),
        **({"tuned": run_info["tuned"]} if "tuned" in run_info else {}),  # a tuned run: its values, how chosen
        "inputs_sha256": inputs_digest(params, run),
    }
    io.write_json(layout.metrics(dataset, noise, name, seed), result)
    plot_history(history, run_name(dataset, noise, name, seed), layout.curves(dataset, noise, name, seed))
    if not exact:
        print(f"warning: {run_name(dataset, noise, name, seed)}: evaluate.max_k = {cfg['max_k']} is below the "
              f"largest test class - 1 ({k_used} neighbours used): MAP@R and R-Precision are underestimates")
    return result


def _log_final(params: dict, dataset: str, noise: str, name: str, seed: int, result: dict, layout: Layout,
               only_if_tracked: bool = False) -> None:
    """The final metrics and curves into the run's MLflow run, once per MLflow run (the volatile record says which
    run has them: an unchanged evaluation of a retrained run logs them again, to the new run). ``only_if_tracked``:
    say nothing about a run with no MLflow run (restored from DVC's cache, trained elsewhere)."""
    from noisydml.tracking import log_to_run

    run_info = io.read_json(layout.run(dataset, noise, name, seed) / "run.json")
    volatile = layout.volatile(dataset, noise, name, seed)
    info = io.read_json(volatile) if volatile.is_file() else {}
    if info.get("fingerprint") not in (None, run_info.get("fingerprint")):
        info = {}  # the run info of another training of this run
    run_id = info.get("mlflow_run_id")
    if (run_id is not None and info.get("final_metrics_logged_to") == run_id) or (run_id is None and only_if_tracked):
        return
    if log_to_run(run_id, {f"final_{k}": v for k, v in result["metrics"].items()},
                  [layout.metrics(dataset, noise, name, seed), layout.curves(dataset, noise, name, seed)],
                  root=layout.root):
        io.write_json(volatile, {**info, "final_metrics_logged_to": run_id})


def evaluate(params: dict, dataset: str, layout: Layout = Layout(), log_to_mlflow: bool = True) -> list[dict]:
    """Evaluate every run of ``dataset`` whose inputs changed; remove metrics of runs no longer in params."""
    runs = [r for r in all_runs(params) if r.dataset == dataset]
    wanted = {layout.metrics(r.dataset, r.noise, r.name, r.seed) for r in runs}
    results, fresh = [], 0
    t0 = time.perf_counter()
    for r in tqdm(runs, desc=f"evaluate {dataset}", unit="run", disable=not params["runtime"]["progress"]):
        where = (r.dataset, r.noise, r.name, r.seed)
        path, run = layout.metrics(*where), layout.root / r.folder
        if path.is_file() and layout.curves(*where).is_file() and (run / "run.json").is_file():
            old = io.read_json(path)
            if old.get("inputs_sha256") == inputs_digest(params, run):
                results.append(old)  # unchanged inputs: the same metrics, bit for bit
                if log_to_mlflow:  # a retrained (bit-identical) run is a new MLflow run: it gets them too
                    _log_final(params, *where, old, layout, only_if_tracked=True)
                continue
        result = evaluate_run(params, *where, layout)
        fresh += 1
        results.append(result)
        if log_to_mlflow:
            _log_final(params, *where, result, layout)
        print(f"evaluate {r.run_name}: " + " ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items()))
    root = layout.root / "metrics" / dataset
    for stale in [p for p in root.rglob("seed*") if p.is_file()]:
        json_path = stale if stale.suffix == ".json" else stale.with_name(stale.name.replace("_curves.png", ".json"))
        if json_path not in wanted:
            stale.unlink()  # a run no longer in params (DVC keeps a persistent output's old files)
    print(f"evaluate {dataset}: {fresh} run(s) evaluated, {len(runs) - fresh} unchanged, "
          f"{time.perf_counter() - t0:.1f}s")
    return results
