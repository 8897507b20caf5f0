"""How well a detector finds the wrong labels, against the truth (the corrupt stage's, or a dataset's own).

Per detector: AUROC and AUPRC of its score (AUPRC's chance level = the noise rate), precision / recall / F1 of its
own flags and AQuA's weighted F1 of them, precision at k = the true number of wrong labels (the share of its top k
that are wrong), and the noise rate it implies (its flagged share). Differences between two detectors on the same
rows come with a paired bootstrap over the rows (:func:`paired_bootstrap`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def judge(scores: pd.DataFrame, is_noisy: np.ndarray) -> dict[str, float]:
    """``scores`` in the audit schema, ``is_noisy`` per row (True = wrong label)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    noisy = np.asarray(is_noisy, bool)
    score = scores["score"].to_numpy(np.float64)
    k = int(noisy.sum())
    out = {"rows": len(noisy), "noise_rate": float(noisy.mean()),
           "auroc": float(roc_auc_score(noisy, score)) if 0 < k < len(noisy) else float("nan"),
           "auprc": float(average_precision_score(noisy, score)) if k else float("nan"),
           # ties broken by row order (stable): a detector that ties everything gets chance, not a lucky sort
           "precision_at_k": float(noisy[np.argsort(-score, kind="stable")[:k]].mean()) if k else float("nan")}
    flags = scores["flagged"]
    if flags.notna().all():
        flagged = flags.to_numpy(bool)
        tp = int((flagged & noisy).sum())
        precision = tp / flagged.sum() if flagged.any() else float("nan")
        recall = tp / k if k else float("nan")
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        out.update(flag_precision=float(precision), flag_recall=float(recall), flag_f1=float(f1),
                   flagged_share=float(flagged.mean()), weighted_f1=weighted_f1(noisy, flagged))
    return out


def weighted_f1(is_noisy: np.ndarray, flagged: np.ndarray) -> float:
    """AQuA's figure (Goswami et al., NeurIPS Datasets & Benchmarks 2023; its ``metrics.py``): the F1 of the flags
    as a two-class prediction (wrong / right label), each class's F1 weighted by its number of rows (scikit-learn's
    ``average='weighted'``). Unlike ``flag_f1`` (the wrong class alone) it credits the rows rightly left alone, so
    on data mostly clean it is high for a detector that flags nothing."""
    from sklearn.metrics import f1_score

    return float(f1_score(np.asarray(is_noisy, bool), np.asarray(flagged, bool), average="weighted",
                          zero_division=0))


def paired_bootstrap(score_a: np.ndarray, score_b: np.ndarray, is_noisy: np.ndarray, metric: str = "auroc",
                     samples: int = 1000, seed: int = 0) -> dict[str, float]:
    """The difference ``metric(a) - metric(b)`` on the same rows, and its 95 % percentile interval over
    ``samples`` resamplings of the rows (the same rows for both: paired)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    fn = {"auroc": roc_auc_score, "auprc": average_precision_score}[metric]
    noisy = np.asarray(is_noisy, bool)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(samples):
        rows = rng.integers(0, len(noisy), len(noisy))
        if noisy[rows].all() or not noisy[rows].any():
            continue
        diffs.append(fn(noisy[rows], score_a[rows]) - fn(noisy[rows], score_b[rows]))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"difference": float(fn(noisy, score_a) - fn(noisy, score_b)), "low": float(low), "high": float(high)}
