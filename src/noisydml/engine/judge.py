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


def _auroc(score: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> float | None:
    """Area under the ROC curve of ``score`` separating ``positive`` from ``negative`` rows (0.5 = chance)."""
    pos, neg = positive & np.isfinite(score), negative & np.isfinite(score)
    if not pos.any() or not neg.any():
        return None
    from sklearn.metrics import roc_auc_score  # here: the import costs every train process ~1 s otherwise

    rows = pos | neg
    return float(roc_auc_score(pos[rows], score[rows]))


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
        # the same decisions read as a noise detector: "flagged" = not kept
        flagged = seen_visits - kept
        flagged_known, flagged_noisy = flagged[known].sum(), flagged[noisy].sum()
        out["diag_flag_precision"] = float(flagged_noisy / flagged_known) if flagged_known and noisy.any() else None
        out["diag_flag_recall"] = float(flagged_noisy / seen_visits[noisy].sum()) if seen_visits[noisy].sum() else None
    if decisions.weights is not None:
        w = np.asarray(decisions.weights, dtype=float)
        out["diag_weight_clean"] = _mean(w, clean)
        out["diag_weight_noisy"] = _mean(w, noisy)
    if decisions.confidence is not None:
        c = np.asarray(decisions.confidence, dtype=float)
        out["diag_confidence_clean"] = _mean(c, clean)
        out["diag_confidence_noisy"] = _mean(c, noisy)
        out["diag_confidence_auroc"] = _auroc(c, clean, noisy)
    if decisions.pseudo_labels is not None:
        pl = np.asarray(decisions.pseudo_labels)
        has = known & (pl >= 0)
        out["diag_pseudo_label_coverage"] = float(has.sum() / known.sum()) if known.sum() else None
        out["diag_pseudo_label_accuracy"] = float((pl[has] == truth.true_label[has]).mean()) if has.any() else None
    if decisions.groups:
        out.update(_score_groups(decisions.groups, truth, noisy))
    if decisions.positives is not None:
        out.update(_score_positives(np.asarray(decisions.positives), truth))
    return {k: v for k, v in out.items() if v is not None}


def group_majorities(groups: np.ndarray, classes: np.ndarray, num_groups: int | None = None):
    """For group ids ``0..num_groups-1`` (default: up to the largest id): each group's majority class (ties: the
    lowest class id; -1 for a group with no row) and its number of rows. Pairs are counted sparsely, never as a
    groups x classes matrix (SOP has tens of thousands of both)."""
    groups, classes = np.asarray(groups, np.int64), np.asarray(classes, np.int64)
    n = int(groups.max(initial=-1)) + 1 if num_groups is None else num_groups
    majority, count = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    if not len(groups):
        return majority, count
    low = int(classes.min())
    width = int(classes.max()) - low + 1
    pairs, counts = np.unique(groups * width + (classes - low), return_counts=True)
    group, cls = pairs // width, pairs % width + low
    order = np.lexsort((cls, -counts, group))  # within a group: the largest count first, then the lowest class
    first = order[np.r_[True, group[order][1:] != group[order][:-1]]]
    majority[group[first]], count[group[first]] = cls[first], counts[first]
    return majority, count


def _mates_of_class(groups: np.ndarray, true_label: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row: how many *other* rows of its group share its true class (rows with an unknown class: 0)."""
    pair = groups.astype(np.int64) * (int(true_label.max(initial=0)) + 2) + (true_label + 1)
    _, inverse, counts = np.unique(pair[rows], return_inverse=True, return_counts=True)
    return np.where(true_label[rows] >= 0, counts[inverse] - 1, 0)


def _score_groups(groups: dict[str, np.ndarray], truth: GroundTruth, noisy: np.ndarray) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    rows = np.flatnonzero(truth.known.astype(bool) & (truth.true_label >= 0))
    has_true, nonempty = np.zeros(len(truth.true_label), bool), np.zeros(len(truth.true_label), bool)
    for name, labels in groups.items():
        labels = np.asarray(labels, dtype=np.int64)
        out[f"diag_groups_{name}"] = float(len(np.unique(labels)))
        if len(rows):
            # purity: the share of rows in their group's majority true class (rows of known true class)
            _, majority_rows = group_majorities(labels[rows], truth.true_label[rows])
            out[f"diag_purity_{name}"] = float(majority_rows.sum() / len(rows))
        all_rows = np.arange(len(labels))
        has_true[all_rows] |= _mates_of_class(labels, truth.true_label, all_rows) > 0
        nonempty |= np.bincount(labels)[labels] > 1
    # truly noisy rows whose true class is trained on (open-set noise: a dissolved class has no true positive)
    scorable = noisy & (truth.true_label >= 0)
    if scorable.any():
        out["diag_pool_true_positive"] = float(has_true[scorable].mean())
        out["diag_pool_nonempty"] = float(nonempty[scorable].mean())
    return out


def _score_positives(positives: np.ndarray, truth: GroundTruth) -> dict[str, float | None]:
    anchors = np.flatnonzero((positives[:, 0] >= 0) & truth.known.astype(bool) & (truth.true_label >= 0))
    if not len(anchors):
        return {}
    drawn = positives[anchors]
    same = truth.true_label[drawn] == truth.true_label[anchors][:, None]
    return {"diag_positive_precision": float(same.mean()), "diag_anchor_true_positive": float(same.any(axis=1).mean())}


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
