"""Label-error detectors on a run's training embeddings, each returning the audit schema (:data:`AUDIT_COLUMNS`).

- :func:`method_decisions`: the method's own decisions (its run's ``decisions.npz``): not kept -> flagged, the
  kept share / weight / confidence as the score, its pseudo-label as the suggestion;
- :func:`datalab`: cleanlab's ``Datalab`` label issues from the features alone (its kNN classifier, k = 10 by
  default, then confident learning): the field's reference;
- :func:`cross_fitted_probabilities` + :func:`confident_learning`: a linear probe trained on k-1 folds of the rows
  scores the k-th (out of sample: an embedding trained on the noisy labels memorises part of them, so an in-sample
  classifier over-trusts them), then cleanlab's ``find_label_issues`` and its self-confidence rank;
- :func:`knn_confident_learning` and :func:`centroid_confident_learning`: confident learning at a benchmark's
  scale (cleanlab's batched ``LabelInspector``, never an N x classes matrix), on a kNN vote and on a cross-fitted
  nearest-class-mean probe;
- :func:`knn_disagreement`: the share of a row's k nearest neighbours (itself excluded) that carry another label,
  flagged above one half, the neighbours' majority as the suggestion: a floor.

Ground truth never enters a detector; :mod:`noisydml.audit.judge` scores them.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from noisydml.audit import AUDIT_COLUMNS, estimate


#: cleanlab's ``find_label_issues`` forks a ``multiprocessing.Pool`` of one process per core by default: forked from a
#: process with threads running (a Ray worker of ``noisydml launch``: torch's and Ray's), a child can inherit a lock
#: held by one of them and wait forever (an audit stage hung so, at 0 % CPU). Its results do not depend on it.
SINGLE_PROCESS = 1


def _frame(sample_id, given, score, flagged=None, suggested=None) -> pd.DataFrame:
    n = len(given)
    return pd.DataFrame({
        "sample_id": np.asarray(sample_id, np.int64), "given_label": np.asarray(given, np.int64),
        "score": np.asarray(score, np.float64),
        "flagged": pd.array([pd.NA] * n if flagged is None else np.asarray(flagged, bool), dtype="boolean"),
        "suggested_label": np.full(n, -1, np.int64) if suggested is None else np.asarray(suggested, np.int64),
    })[list(AUDIT_COLUMNS)]


def method_decisions(decisions: dict[str, np.ndarray], sample_id: np.ndarray, given: np.ndarray
                     ) -> pd.DataFrame | None:
    """A method's own decisions in the audit schema (None when it made none of keep / weights / confidence).

    Score: 1 - the kept share (``keep``), else 1 - the confidence, else 1 - the weight scaled to its maximum;
    flagged: not kept (kept share below 0.5), only where the method keeps or drops (a weight or a confidence has
    no threshold of the method's own); suggested: the pseudo-label where it differs from the given label. A row
    without a decision (NaN: no batch visited it in the last epoch; or a row the method never trained on) scores 0
    and is not flagged."""
    # rows the method never saw (a chained run trained on a subset) get no decision: score 0, not flagged
    rows = pd.Series(np.arange(len(decisions["sample_id"])), index=decisions["sample_id"]).reindex(sample_id)
    seen = rows.notna().to_numpy()
    rows = rows.fillna(0).to_numpy(np.int64)

    def field(name: str, fill: float) -> np.ndarray:
        return np.where(seen, np.asarray(decisions[name], np.float64)[rows], fill)

    flagged = None
    if "keep" in decisions:
        keep = field("keep", np.nan)
        score, flagged = 1 - keep, np.where(np.isnan(keep), False, keep < 0.5)
    elif "confidence" in decisions:
        score = 1 - field("confidence", np.nan)
    elif "weights" in decisions:
        weights = field("weights", np.nan)
        score = 1 - weights / max(np.nanmax(weights), 1e-12)
    else:
        return None
    suggested = None
    if "pseudo_labels" in decisions:
        pseudo = field("pseudo_labels", -1).astype(np.int64)
        suggested = np.where((pseudo >= 0) & (pseudo != given), pseudo, -1)
    return _frame(sample_id, given, np.nan_to_num(score, nan=0.0), flagged, suggested)


def knn_disagreement(embeddings: np.ndarray, given: np.ndarray, sample_id: np.ndarray, k: int = 10
                     ) -> pd.DataFrame:
    """The share of a row's ``k`` nearest neighbours (cosine, itself excluded) whose label differs from its own;
    flagged above 1/2, suggesting the neighbours' most common label."""
    neighbour_labels = given[nearest(embeddings, k)]
    score = (neighbour_labels != given[:, None]).mean(1)
    majority = majority_label(neighbour_labels)
    flagged = score > 0.5
    return _frame(sample_id, given, score, flagged, np.where(flagged & (majority != given), majority, -1))


def datalab(embeddings: np.ndarray, given: np.ndarray, sample_id: np.ndarray, k: int = 10) -> pd.DataFrame:
    """cleanlab's ``Datalab`` label issues from the features alone (``find_issues(features=...)``, its kNN
    classifier with ``k`` neighbours): score = 1 - its label quality, flagged = its ``is_label_issue``, suggested
    = its ``predicted_label`` where it differs."""
    from cleanlab import Datalab

    # cleanlab 2.9 builds dense float64 probabilities from the kNN graph, and copies: killed at 24 GB on SOP
    refuse_dense("datalab", len(given), int(given.max()) + 1, 8, "and copies of them")
    lab = Datalab(data={"label": np.asarray(given)}, label_name="label", verbosity=0)
    lab.find_issues(features=np.ascontiguousarray(_unit(embeddings), dtype=np.float32),
                    issue_types={"label": {"k": k, "clean_learning_kwargs": {
                        "find_label_issues_kwargs": {"n_jobs": SINGLE_PROCESS}}},
                                 "near_duplicate": {"k": k}})
    issues = lab.get_issues("label")
    flagged = issues["is_label_issue"].to_numpy(bool)
    predicted = issues["predicted_label"].to_numpy(np.int64)
    frame = _frame(sample_id, given, 1 - issues["label_score"].to_numpy(np.float64), flagged,
                   np.where(flagged & (predicted != given), predicted, -1))
    frame.attrs["conflicts"] = conflicting_duplicates(lab.get_issues("near_duplicate")["near_duplicate_sets"],
                                                      given, sample_id)
    return frame


def conflicting_duplicates(sets, given: np.ndarray, sample_id: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Pairs of near-duplicates (cleanlab's ``near_duplicate_sets``: per row, the rows closer than its threshold,
    0.13 x the median distance to a nearest neighbour) whose labels differ, once each, as ``(sample_id, other_id,
    given_label, other_label)`` of plain ints (kept in a frame's ``attrs``, which pandas compares). One of the two
    labels is wrong, or the two classes overlap."""
    return [(int(sample_id[i]), int(sample_id[j]), int(given[i]), int(given[j]))
            for i, members in enumerate(sets) for j in map(int, members) if i < j and given[i] != given[j]]


#: cleanlab's label-quality score the confident-learning detectors rank by (ours, of cleanlab's three, measured on
#: the same probe by ``scripts/audit_calibration.py``: ``self_confidence``, the probe's probability of the given
#: label, ranks the wrong labels above ``normalized_margin`` at every noise kind and rate there; docs/label-audit.md).
RANKING = "self_confidence"

#: Ours: the probability every class not among a row's neighbours keeps in :func:`knn_confident_learning` (cleanlab
#: needs every class above zero), and the memory one batch of its dense probabilities may take.
KNN_PROBABILITY_FLOOR = 1e-4
KNN_BATCH_BYTES = 64 * 2**20


def knn_probabilities(neighbour_labels: np.ndarray, classes: int) -> np.ndarray:
    """Dense ``(rows, classes)`` float32 probabilities of a kNN vote: each row's neighbours' label shares, every
    other class :data:`KNN_PROBABILITY_FLOOR`, renormalised. ``neighbour_labels``: ``(rows, k)``."""
    rows, k = neighbour_labels.shape
    probs = np.full((rows, classes), KNN_PROBABILITY_FLOOR, np.float32)
    np.add.at(probs, (np.repeat(np.arange(rows), k), neighbour_labels.ravel()), 1.0 / k)
    return probs / probs.sum(1, keepdims=True)


def knn_confident_learning(embeddings: np.ndarray, given: np.ndarray, sample_id: np.ndarray, k: int = 10,
                           batch_bytes: int = KNN_BATCH_BYTES) -> pd.DataFrame:
    """Confident learning at a benchmark's scale: the out-of-sample probabilities of a kNN vote (``k`` nearest
    neighbours by cosine, the row itself excluded: :func:`knn_probabilities`) in batches of at most ``batch_bytes``
    through :func:`batched_confident_learning`. Never an N x classes matrix: memory is the embeddings, the N x k
    neighbours and one batch."""
    given = np.asarray(given, np.int64)
    classes = int(given.max()) + 1
    neighbour_labels = given[nearest(embeddings, k)]
    step = max(1, batch_bytes // (4 * classes))
    batches = [np.arange(i, min(i + step, len(given))) for i in range(0, len(given), step)]
    return batched_confident_learning(given, sample_id, batches,
                                      lambda rows: knn_probabilities(neighbour_labels[rows], classes))


def batched_confident_learning(given: np.ndarray, sample_id: np.ndarray, batches: list[np.ndarray],
                               probabilities) -> pd.DataFrame:
    """cleanlab's low-memory ``LabelInspector`` over out-of-sample probabilities made batch by batch
    (``probabilities(rows)`` -> ``(len(rows), classes)``; ``batches``: row indices covering every row once): one
    pass for the per-class confident thresholds, one for the label quality (:data:`RANKING`) and the issues: as
    many as cleanlab counts, the lowest qualities.
    Score = 1 - quality; flagged = its issues; suggested = the top class of a flagged row;
    ``attrs['estimated_noise_rate']``: :func:`noisydml.audit.estimate.from_probability_of_label`."""
    from cleanlab.experimental.label_issues_batched import LabelInspector

    inspector = LabelInspector(num_class=int(given.max()) + 1, verbose=False, store_results=True,
                               quality_score_kwargs={"method": RANKING})
    for rows in batches:
        inspector.update_confident_thresholds(given[rows], probabilities(rows))
    quality, top, p_given = np.empty(len(given)), np.empty(len(given), np.int64), np.empty(len(given))
    for rows in batches:
        probs = probabilities(rows)
        quality[rows] = inspector.score_label_quality(given[rows], probs)
        top[rows] = probs.argmax(1)
        p_given[rows] = probs[np.arange(len(rows)), given[rows]]
    # cleanlab's own ``get_label_issues`` takes the lowest qualities by an unstable argsort, whose order among equal
    # qualities (a kNN vote gives many) follows the CPU's numpy build: the same count, ties broken by row instead
    flagged = np.zeros(len(given), bool)
    flagged[lowest(quality, inspector.get_num_issues(silent=True))] = True
    frame = _frame(sample_id, given, 1 - quality, flagged, np.where(flagged & (top != given), top, -1))
    frame.attrs["estimated_noise_rate"] = estimate.from_probability_of_label(p_given)
    return frame


#: Ours: the softmax temperature of :func:`centroid_confident_learning`'s probe over cosine similarities.
CENTROID_TEMPERATURE = 0.05
#: Ours: dense N x classes probabilities above this many bytes (:func:`cross_fitted_probabilities`' float32,
#: :func:`datalab`'s float64) are refused, naming the batched detectors that do that scale.
DENSE_PROBE_BYTES = 2**30


def refuse_dense(detector: str, rows: int, classes: int, item_bytes: int, besides: str) -> None:
    """Refuse a detector whose dense ``rows`` x ``classes`` probabilities (``item_bytes`` each; ``besides``: what
    else it costs) would pass :data:`DENSE_PROBE_BYTES`, naming the batched detectors that do that scale."""
    size = rows * classes * item_bytes
    if size > DENSE_PROBE_BYTES:
        raise ValueError(f"{detector}: its probabilities would be {rows:,} rows x {classes:,} classes "
                         f"({size / 2**30:.1f} GiB dense, above {DENSE_PROBE_BYTES / 2**30:.0f} GiB, {besides}); at "
                         "this scale use centroid_confident_learning or knn_confident_learning (batched)")


def class_folds(given: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """Each row's fold, 0..folds-1: within each class its rows in a seeded random order dealt round-robin from a
    random fold, so each class's fold counts differ by at most one (and a class of two rows sits in two folds: its
    other row vouches for each)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(given))
    order = order[np.argsort(given[order], kind="stable")]  # by class, random within it
    rank = np.arange(len(given)) - np.searchsorted(given[order], given[order], side="left")
    offset = rng.integers(0, folds, int(given.max()) + 1)  # a class's first row in a random fold
    fold = np.empty(len(given), np.int64)
    fold[order] = (rank + offset[given[order]]) % folds
    return fold


def cross_fitted_class_means(x: np.ndarray, given: np.ndarray, folds: int, seed: int = 0):
    """``(fold, means_of)``: each row's fold (:func:`class_folds`) and ``means_of(f)`` -> fold ``f``'s probe, the
    other folds' unit class mean directions ``(classes, dim)`` float32 and which classes they hold. ``x``: unit
    rows. Memory: two classes x dim matrices, whatever N."""
    classes = int(given.max()) + 1
    fold = class_folds(given, folds, seed)
    sums = np.zeros((classes, x.shape[1]), np.float64)
    np.add.at(sums, given, x)
    counts = np.bincount(given, minlength=classes)

    def means_of(f: int) -> tuple[np.ndarray, np.ndarray]:
        mine = fold == f
        held = np.zeros_like(sums)
        np.add.at(held, given[mine], x[mine])
        means = sums - held
        present = (counts - np.bincount(given[mine], minlength=classes)) > 0
        return (means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)).astype(np.float32), present

    return fold, means_of


def centroid_confident_learning(embeddings: np.ndarray, given: np.ndarray, sample_id: np.ndarray, folds: int = 5,
                                seed: int = 0, temperature: float = CENTROID_TEMPERATURE,
                                batch_bytes: int = KNN_BATCH_BYTES) -> pd.DataFrame:
    """Confident learning on a cross-fitted probe at a benchmark's scale: for each of ``folds`` class-stratified
    folds (:func:`class_folds`) the probe is the nearest-class-mean classifier of the other folds' rows (a linear
    probe: one unit weight vector per class, the class's mean direction; softmax over cosine similarities at
    ``temperature``), and it scores the fold's rows, so no row is scored by a model that saw it. A class with no
    row in the other folds gets probability :data:`KNN_PROBABILITY_FLOOR`. The probabilities go through
    :func:`batched_confident_learning` in batches of at most ``batch_bytes``, fold by fold: memory is the
    embeddings, two classes x dim matrices and one batch, never N x classes."""
    x = _unit(embeddings)
    given = np.asarray(given, np.int64)
    classes = int(given.max()) + 1
    fold, means_of = cross_fitted_class_means(x, given, folds, seed)
    step = max(1, batch_bytes // (4 * classes))
    batches = [rows[i:i + step] for f in range(folds) for rows in [np.flatnonzero(fold == f)]
               for i in range(0, len(rows), step)]
    probe = functools.lru_cache(maxsize=1)(means_of)  # batches come fold by fold

    def probabilities(rows: np.ndarray) -> np.ndarray:
        means, present = probe(int(fold[rows[0]]))
        logits = x[rows] @ means.T / temperature
        logits[:, ~present] = -np.inf
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        probs = np.maximum(probs, KNN_PROBABILITY_FLOOR)
        return probs / probs.sum(1, keepdims=True)

    return batched_confident_learning(given, sample_id, batches, probabilities)


def open_set(embeddings: np.ndarray, given: np.ndarray, sample_id: np.ndarray, folds: int = 5, seed: int = 0
             ) -> pd.DataFrame:
    """A detector built for open-set noise (an image of no training class filed under one, as small-cluster noise
    and web noise make): score = 1 - the row's cosine similarity to the nearest training class's mean direction,
    the means cross-fitted as :func:`centroid_confident_learning`'s (the other folds' rows), so a row far from
    every class scores high whatever its label. Ranks only: no flags, no suggestion (there is no right class to
    suggest). Memory: the embeddings and two classes x dim matrices, one fold's similarities at a time."""
    x = _unit(embeddings)
    given = np.asarray(given, np.int64)
    fold, means_of = cross_fitted_class_means(x, given, folds, seed)
    nearest_class = np.empty(len(given))
    for f in range(folds):
        mine = np.flatnonzero(fold == f)
        means, present = means_of(f)
        for start in range(0, len(mine), 4096):
            rows = mine[start:start + 4096]
            sims = x[rows] @ means.T
            sims[:, ~present] = -np.inf
            nearest_class[rows] = sims.max(1)
    return _frame(sample_id, given, 1 - nearest_class)


def cross_fitted_probabilities(embeddings: np.ndarray, given: np.ndarray, folds: int = 5, seed: int = 0,
                               max_iter: int = 200) -> np.ndarray:
    """Out-of-sample class probabilities ``(N, C)`` float32, C = the labels present: for each of ``folds``
    stratified folds, a multinomial logistic regression on the other folds' rows predicts the fold's rows, so no
    row is scored by a model that saw it. Labels must be 0..C-1."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    x = _unit(embeddings).astype(np.float32)
    classes = int(given.max()) + 1
    refuse_dense("confident_learning", len(given), classes, 4, "and a multinomial fit per fold over every class")
    probs = np.zeros((len(given), classes), np.float32)
    counts = np.bincount(given, minlength=classes)
    splits = min(folds, int(counts[counts > 0].min())) if counts.min() > 0 else folds
    splitter = StratifiedKFold(n_splits=max(2, splits), shuffle=True, random_state=seed)
    for train, test in splitter.split(x, given):
        probe = LogisticRegression(max_iter=max_iter, C=1.0)
        probe.fit(x[train], given[train])
        probs[np.ix_(test, probe.classes_)] = probe.predict_proba(x[test])
    return probs


def confident_learning(probs: np.ndarray, given: np.ndarray, sample_id: np.ndarray) -> pd.DataFrame:
    """cleanlab's ``find_label_issues`` on out-of-sample probabilities (flags) and its label quality by
    :data:`RANKING` (score = 1 - quality); suggested = the most probable other class of a flagged row."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    flagged = find_label_issues(given, probs, filter_by="prune_by_noise_rate", n_jobs=SINGLE_PROCESS)
    quality = get_label_quality_scores(given, probs, method=RANKING)
    predicted = probs.argmax(1)
    return _frame(sample_id, given, 1 - quality, flagged, np.where(flagged & (predicted != given), predicted, -1))


def estimated_noise_rate(probs: np.ndarray, given: np.ndarray) -> float:
    """The audit's estimate of the share of wrong labels (:data:`noisydml.audit.estimate.DEFAULT`): the rate a
    method that must be told one (PRISM, SGPS) can be given when the truth is unknown."""
    return estimate.from_probability_of_label(probs[np.arange(len(given)), given])


#: Ours: neighbours searched beyond the k used, so that rows tied at the k-th similarity are chosen by their index
#: rather than by the search's internal order (which differs between CPUs' SIMD paths).
TIE_MARGIN = 8


def nearest(embeddings: np.ndarray, k: int) -> np.ndarray:
    """``(N, k)`` indices of each row's ``k`` nearest neighbours by cosine, itself excluded, most similar first and
    equal similarities in the order of their row index (deterministic across hosts given the same similarities)."""
    from noisydml.neighbours import knn

    sims, idx = knn(_unit(embeddings), k + TIE_MARGIN)
    order = np.lexsort((idx, -sims), axis=-1)
    return np.take_along_axis(idx, order, axis=1)[:, :k]


def majority_label(neighbour_labels: np.ndarray) -> np.ndarray:
    """Each row's most common neighbour label (``(N, k)`` -> ``(N,)``; the smallest label among those tied)."""
    return np.array([np.bincount(row).argmax() for row in neighbour_labels])


def lowest(values: np.ndarray, count: int) -> np.ndarray:
    """The indices of the ``count`` smallest ``values``, smallest first, equal values by index."""
    return np.lexsort((np.arange(len(values)), values))[:count]


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
