"""Face verification: the 10-fold pair accuracy of insightface's ``.bin`` sets, and TAR at FAR over template pairs.

**10-fold accuracy** (LFW, CFP-FP, AgeDB-30; insightface ``arcface_torch/eval/verification.py``, read, not
copied): each image's embedding and its horizontal flip's are summed and L2-normalised; a pair's distance is the
squared Euclidean distance; "same" is predicted when the distance is below a threshold from 0 to 4 by 0.01. The
pairs are cut into 10 consecutive folds (no shuffling); for each fold the threshold with the best accuracy on the
other 9 (the first, i.e. smallest, on ties) is applied to it. Reported: mean and standard deviation of the 10 fold
accuracies.

**VAL at FAR** (insightface ``verification.py``'s ``calculate_val``, beside the accuracy): per fold, the
threshold (a grid from 0 to 4 by 0.001) at which the other 9 folds' FAR equals the target (1e-3), linearly
interpolated between grid points, then the fold's own VAL (true accepts / genuine pairs) and FAR at it; the mean
and standard deviation of VAL, the mean FAR. Ours where the code cannot run as written: scipy now refuses the
repeated x of the FAR curve's flat stretches in ``interp1d``, so the threshold is interpolated between the last
grid point below the target FAR and the first at or above it, as the linear search ran on them (keeping the first
threshold of each FAR value instead, as some forks do, interpolates from threshold 0 and gives a far stricter
threshold: on tests/test_verification_readings.py's 600 pairs, VAL 10 % against 71 % here).

**TAR at FAR** (IJB-B/C 1:1; insightface ``eval_ijbc.py``): image features pooled to template features (mean over
the images of one media, summed over the template's media, L2-normalised), a pair scored by the cosine of its two
templates. Two readings of "TAR at FAR f" (``evaluate.tar_reading``): ``strict`` (ours, the default): the largest
ROC point whose FAR does not exceed ``f`` (accept scores above the ``k+1``-th highest impostor score,
``k = floor(f * impostors)``); ``insightface``: the point of scikit-learn's ``roc_curve`` nearest to ``f``
(``argmin |fpr - f|``, ties to the higher TAR), which may lie above ``f``: the published tables' reading, for
side-by-side tables (0 to -0.36 points between the two at 1e-3..1e-5 on IJB-C, -3.2 at 1e-6). We also return how many false accepts the
threshold rests on (below ~10 the FAR itself is noise) and a Wilson 95 % interval of the TAR over the genuine
pairs. The Wilson interval treats pairs as independent; they are not (one identity's templates enter many pairs),
so :func:`tar_interval_over_identities` gives the interval that counts: a bootstrap over identities (ours),
which resamples whole identities and with them every pair they enter (each threshold found again on the resampled
impostors). Nothing here builds an N x N matrix: pairs are scored one row at a time, in chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: insightface's threshold grid on the squared distance of unit vectors (0 .. 4).
THRESHOLDS = np.arange(0.0, 4.0, 0.01)
FOLDS = 10
#: Ours: the FARs reported (Table IV's columns).
VERIFICATION_FARS = (1e-3, 1e-4, 1e-5)


def l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def flip_summed(embeddings: np.ndarray, flipped: np.ndarray | None) -> np.ndarray:
    """insightface's "Accuracy-Flip" features: image + flipped-image embeddings, L2-normalised."""
    return l2_normalise(embeddings if flipped is None else np.asarray(embeddings, np.float64) + flipped)


#: insightface's VAL threshold grid and target FAR (``calculate_val``).
VAL_THRESHOLDS = np.arange(0.0, 4.0, 0.001)
VAL_FAR = 1e-3
#: The readings of TAR at FAR (the module docstring); ``strict`` is ours, ``insightface`` the published tables'.
TAR_READINGS = ("strict", "insightface")


@dataclass(frozen=True)
class FoldAccuracy:
    mean: float
    std: float
    folds: np.ndarray  # (10,) test-fold accuracies
    thresholds: np.ndarray  # (10,) the threshold chosen on the other folds


def ten_fold_accuracy(features: np.ndarray, issame: np.ndarray, folds: int = FOLDS,
                      thresholds: np.ndarray = THRESHOLDS) -> FoldAccuracy:
    """The protocol's accuracy of ``features`` (2P rows, pair ``i`` = rows ``2i, 2i+1``, already flip-summed and
    normalised) on the P flags ``issame``."""
    from sklearn.model_selection import KFold

    features = np.asarray(features, np.float64)
    issame = np.asarray(issame, bool)
    if len(features) != 2 * len(issame):
        raise ValueError(f"{len(features)} features for {len(issame)} pairs (need two per pair)")
    dist = np.sum((features[0::2] - features[1::2]) ** 2, axis=1)
    # correct[p, t]: pair p judged right at threshold t (same when dist < threshold)
    correct = (dist[:, None] < thresholds[None, :]) == issame[:, None]
    accs, chosen = np.zeros(folds), np.zeros(folds)
    for k, (train, test) in enumerate(KFold(n_splits=folds, shuffle=False).split(dist)):
        best = int(np.argmax(correct[train].mean(0)))  # the first maximum: the smallest threshold
        chosen[k] = thresholds[best]
        accs[k] = correct[test, best].mean()
    return FoldAccuracy(float(accs.mean()), float(accs.std()), accs, chosen)


@dataclass(frozen=True)
class ValAtFar:
    val: float  # mean over the test folds
    val_std: float
    far: float  # the test folds' mean FAR at the chosen thresholds


def val_at_far(features: np.ndarray, issame: np.ndarray, far_target: float = VAL_FAR, folds: int = FOLDS,
               thresholds: np.ndarray = VAL_THRESHOLDS) -> ValAtFar:
    """insightface's VAL at FAR of ``features`` (2P rows as :func:`ten_fold_accuracy`'s) on the P flags
    ``issame`` (the module docstring)."""
    from sklearn.model_selection import KFold

    features = np.asarray(features, np.float64)
    issame = np.asarray(issame, bool)
    dist = np.sum((features[0::2] - features[1::2]) ** 2, axis=1)
    vals, fars = np.zeros(folds), np.zeros(folds)
    for k, (train, test) in enumerate(KFold(n_splits=folds, shuffle=False).split(dist)):
        impostor = dist[train][~issame[train]]
        # FAR on the 9 folds at each threshold (same when dist < threshold), one sort instead of a grid of passes
        far_train = np.searchsorted(np.sort(impostor), thresholds, side="left") / max(len(impostor), 1)
        threshold = _threshold_at_far(far_train, thresholds, far_target) if far_train.max() >= far_target else 0.0
        accept = dist[test] < threshold
        same = issame[test]
        vals[k] = accept[same].sum() / max(same.sum(), 1)
        fars[k] = accept[~same].sum() / max((~same).sum(), 1)
    return ValAtFar(float(vals.mean()), float(vals.std()), float(fars.mean()))


def _threshold_at_far(far: np.ndarray, thresholds: np.ndarray, target: float) -> float:
    """The threshold at which the (non-decreasing) FAR curve ``far`` over ``thresholds`` reaches ``target``:
    linear between the last grid point below it and the first at or above it (a grid point exactly at it: that
    point), as ``interp1d``'s linear search runs on a curve with flat stretches."""
    at = int(np.searchsorted(far, target, side="left"))
    if at == 0 or far[at] == target:
        return float(thresholds[at])
    lo, hi = at - 1, at
    return float(thresholds[lo] + (target - far[lo]) * (thresholds[hi] - thresholds[lo]) / (far[hi] - far[lo]))


def template_features(features: np.ndarray, templates: np.ndarray, media: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(template ids, features)``: per template, the mean feature of each media summed over its media, then
    L2-normalised (insightface's ``image2template_feature``)."""
    features = np.asarray(features, np.float64)
    frame = pd.DataFrame({"template": templates, "media": media})
    groups = frame.groupby(["template", "media"], sort=True).indices
    keys = list(groups)
    media_means = np.stack([features[groups[k]].mean(0) for k in keys])
    owner = np.array([k[0] for k in keys])
    ids, inverse = np.unique(owner, return_inverse=True)
    summed = np.zeros((len(ids), features.shape[1]))
    np.add.at(summed, inverse, media_means)
    return ids, l2_normalise(summed)


def pair_scores(template_ids: np.ndarray, template_feats: np.ndarray, t1: np.ndarray, t2: np.ndarray,
                chunk: int = 1 << 18) -> np.ndarray:
    """Cosine of each listed template pair, ``chunk`` pairs at a time."""
    index = pd.Index(template_ids)
    i1, i2 = index.get_indexer(t1), index.get_indexer(t2)
    if (i1 < 0).any() or (i2 < 0).any():
        raise ValueError("a pair names a template without features")
    out = np.empty(len(i1))
    for s in range(0, len(i1), chunk):
        out[s:s + chunk] = np.einsum("ij,ij->i", template_feats[i1[s:s + chunk]], template_feats[i2[s:s + chunk]])
    return out


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % by default)."""
    if trials == 0:
        return float("nan"), float("nan")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class TarAtFar:
    far: float  # the FAR asked for
    tar: float
    threshold: float  # accept scores strictly above it
    false_accepts: int  # impostor pairs above the threshold (what the FAR rests on)
    impostors: int
    genuine: int
    tar_low: float  # Wilson 95 % over the genuine pairs
    tar_high: float


def tar_at_far(scores: np.ndarray, labels: np.ndarray, fars=VERIFICATION_FARS) -> list[TarAtFar]:
    """TAR at each FAR ``f``: the largest ROC point with FAR <= f (see the module docstring)."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(bool)
    genuine, impostor = scores[labels], np.sort(scores[~labels])[::-1]
    if len(genuine) == 0 or len(impostor) == 0:
        raise ValueError("TAR at FAR needs genuine and impostor pairs")
    out = []
    for far in fars:
        allowed = int(math.floor(far * len(impostor) + 1e-9))
        if allowed >= len(impostor):
            threshold = -math.inf
        else:
            threshold = impostor[allowed]  # accept strictly above the (allowed+1)-th highest impostor score
        accepted = int((genuine > threshold).sum())
        false = int((impostor > threshold).sum())
        low, high = wilson_interval(accepted, len(genuine))
        out.append(TarAtFar(far, accepted / len(genuine), float(threshold), false, len(impostor), len(genuine),
                            low, high))
    return out


def tar_at_far_insightface(scores: np.ndarray, labels: np.ndarray, fars=VERIFICATION_FARS) -> list[float]:
    """TAR at each FAR as insightface's ``eval_ijbc.py`` reads it: scikit-learn's ``roc_curve`` (its default
    ``drop_intermediate``), the points reversed (so that of equal FARs the higher TAR comes first), the first point
    nearest to ``f`` in FAR."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(np.asarray(labels).astype(int), np.asarray(scores, np.float64))
    fpr, tpr = fpr[::-1], tpr[::-1]
    return [float(tpr[int(np.argmin(np.abs(fpr - far)))]) for far in fars]


def template_identities(template1: np.ndarray, template2: np.ndarray, labels: np.ndarray) -> dict[int, int]:
    """Template -> identity index: templates joined by a genuine pair are one identity (union-find over the
    genuine pairs; the IJB meta files name no subjects, the genuine pairs define them)."""
    parent: dict[int, int] = {}

    def find(t: int) -> int:
        parent.setdefault(t, t)
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for a, b, genuine in zip(np.asarray(template1).tolist(), np.asarray(template2).tolist(),
                             np.asarray(labels).astype(bool).tolist()):
        ra, rb = find(a), find(b)
        if genuine and ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots = {t: find(t) for t in list(parent)}
    index = {root: i for i, root in enumerate(sorted(set(roots.values())))}
    return {t: index[r] for t, r in roots.items()}


def tar_interval_over_identities(scores: np.ndarray, labels: np.ndarray, template1: np.ndarray,
                                 template2: np.ndarray, fars=VERIFICATION_FARS, resamples: int = 500, seed: int = 0,
                                 level: float = 0.95) -> dict[float, tuple[float, float]]:
    """Per FAR, the percentile interval of TAR at that FAR over a bootstrap of identities (ours): each resample
    draws the identities with replacement (multinomial counts ``w``); a genuine pair of identity ``i`` counts
    ``w[i]`` times, an impostor pair of identities ``i, j`` ``w[i] * w[j]`` times; the threshold is found again on
    the weighted impostors as :func:`tar_at_far` finds it (accept above the score at which the weighted false
    accepts would exceed ``floor(f * impostor weight)``)."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(bool)
    identity = template_identities(template1, template2, labels)
    id1 = np.array([identity[t] for t in np.asarray(template1).tolist()])
    id2 = np.array([identity[t] for t in np.asarray(template2).tolist()])
    order = np.argsort(-scores[~labels], kind="stable")
    impostor, imp1, imp2 = scores[~labels][order], id1[~labels][order], id2[~labels][order]
    genuine, gen = scores[labels], id1[labels]
    count = len(set(identity.values()))
    draws = np.random.default_rng(seed).multinomial(count, np.full(count, 1 / count), size=resamples).astype(np.float64)
    tars = {far: np.empty(resamples) for far in fars}
    for r, w in enumerate(draws):
        weights = w[imp1] * w[imp2]
        cumulative = np.cumsum(weights)
        genuine_weights = w[gen]
        for far in fars:
            allowed = math.floor(far * cumulative[-1] + 1e-9)
            # the first impostor (highest score first) at which the weighted false accepts exceed `allowed`
            at = int(np.searchsorted(cumulative, allowed, side="right"))
            threshold = impostor[at] if at < len(impostor) else -math.inf
            tars[far][r] = genuine_weights[genuine > threshold].sum() / max(genuine_weights.sum(), 1e-12)
    tail = (1 - level) / 2
    return {far: tuple(float(v) for v in np.quantile(values, [tail, 1 - tail])) for far, values in tars.items()}
