"""Scores a method's decisions against ground truth the method never sees.

The trainer holds the corrupt stage's ground truth (which samples are truly
noisy, their true classes) and, after every epoch, turns the method's
:class:`~noisydml.methods.base.Decisions` into ``diag_*`` numbers. On datasets
with real noise only verified samples count (``known``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from noisydml.methods.base import Decisions


@dataclass
class GroundTruth:
    """Per training row: truly noisy?, the true class in training-label ids (-1 = a class not trained on),
    and whether the row's truth is known (all rows for synthetic noise; verified ones for real noise)."""

    is_noisy: np.ndarray
    true_label: np.ndarray
    known: np.ndarray

    def subset(self, rows: np.ndarray) -> "GroundTruth":
        return GroundTruth(self.is_noisy[rows], self.true_label[rows], self.known[rows])


def _mean(values: np.ndarray, mask: np.ndarray, weights: np.ndarray | None = None) -> float | None:
    ok = mask & np.isfinite(values)
    if not ok.any():
        return None
    w = np.ones(len(values)) if weights is None else weights.astype(float)
    total = w[ok].sum()
    return float((values[ok] * w[ok]).sum() / total) if total > 0 else None


def score_decisions(decisions: Decisions | None, truth: GroundTruth) -> dict[str, float]:
    """``diag_*`` scores of one epoch's decisions (empty when the method decides nothing)."""
    if decisions is None:
        return {}
    out: dict[str, float | None] = {}
    known = truth.known.astype(bool)
    clean = known & ~truth.is_noisy.astype(bool)
    noisy = known & truth.is_noisy.astype(bool)
    if decisions.keep is not None:
        keep = np.asarray(decisions.keep, dtype=float)
        visits = np.ones(len(keep)) if decisions.visits is None else np.asarray(decisions.visits, dtype=float)
        seen = np.isfinite(keep) & (visits > 0)
        kept = np.where(seen, keep * visits, 0.0)          # kept visits per row
        seen_visits = np.where(seen, visits, 0.0)
        kept_known, kept_clean = kept[known].sum(), kept[clean].sum()
        out["diag_kept_fraction"] = float(kept.sum() / seen_visits.sum()) if seen_visits.sum() else None
        out["diag_selection_precision"] = float(kept_clean / kept_known) if kept_known else None
        out["diag_selection_recall"] = float(kept_clean / seen_visits[clean].sum()) if seen_visits[clean].sum() else None
    if decisions.weights is not None:
        w = np.asarray(decisions.weights, dtype=float)
        out["diag_weight_clean"] = _mean(w, clean)
        out["diag_weight_noisy"] = _mean(w, noisy)
    if decisions.confidence is not None:
        c = np.asarray(decisions.confidence, dtype=float)
        out["diag_confidence_clean"] = _mean(c, clean)
        out["diag_confidence_noisy"] = _mean(c, noisy)
    if decisions.pseudo_labels is not None:
        pl = np.asarray(decisions.pseudo_labels)
        has = known & (pl >= 0)
        out["diag_pseudo_label_coverage"] = float(has.sum() / known.sum()) if known.sum() else None
        out["diag_pseudo_label_accuracy"] = float((pl[has] == truth.true_label[has]).mean()) if has.any() else None
    return {k: v for k, v in out.items() if v is not None}


def decision_histograms(decisions: Decisions | None, truth: GroundTruth, bins: int = 10) -> dict[str, dict]:
    """Histograms of the per-sample weights and confidences of truly clean and truly noisy samples (known
    ones only): ``{"weights": {"edges": [...], "clean": [...], "noisy": [...]}, ...}``, bins over [0, 1]
    (or the values' range when they leave it)."""
    if decisions is None:
        return {}
    known = truth.known.astype(bool)
    clean = known & ~truth.is_noisy.astype(bool)
    noisy = known & truth.is_noisy.astype(bool)
    out = {}
    for name in ("weights", "confidence"):
        values = getattr(decisions, name)
        if values is None:
            continue
        values = np.asarray(values, dtype=float)
        finite = np.isfinite(values)
        if not finite.any():
            continue
        low, high = min(0.0, float(values[finite].min())), max(1.0, float(values[finite].max()))
        edges = np.linspace(low, high, bins + 1)
        out[name] = {"edges": [float(e) for e in edges],
                     "clean": np.histogram(values[clean & finite], edges)[0].tolist(),
                     "noisy": np.histogram(values[noisy & finite], edges)[0].tolist()}
    return out
