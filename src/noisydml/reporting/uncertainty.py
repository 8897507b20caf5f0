"""How sure a difference between two runs is: a 95% interval over seeds, one over test classes, and a verdict
decided by the intervals, never by the sign of a mean.

Two sources of chance move a retrieval metric, and an ordering must survive both:

- **training** (the seed: initial head, batch order, the noise draw where it is seeded with the run): the paired
  per-seed differences (the same seed trains both runs on the same labels) give a Student-t interval of their mean,
  ``mean ± t(level, n-1) · sd / sqrt(n)`` (:func:`seed_interval`); it needs at least two seeds;
- **the test set** (which classes happen to be in it): queries of one class share their gallery, so they are
  resampled together -- a bootstrap over test classes, one resample of classes applied to every seed and to both
  runs (paired), of the mean over seeds of the difference in P@1 (:func:`class_interval`, percentile interval).

The verdict (:func:`verdict`): **holds** when both intervals lie above 0, **reversed** when both lie below 0,
**undecided** otherwise (an interval that holds 0; one seed, which has no seed interval). A difference of a single
query is undecided whatever its sign: the classes' resamples leave that query's class out in about a third of them.

:func:`detectable` is the smallest mean difference the seeds can decide at their observed spread (the seed
interval's half-width): what the report states as the grid's resolution.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats

HOLDS, REVERSED, UNDECIDED = "holds", "reversed", "undecided"
RULE = ("holds: both 95% intervals of the difference (over seeds: paired t; over test classes: bootstrap) lie above "
        "0; reversed: both lie below 0; undecided: either holds 0, or there is one seed (no interval over seeds)")


def seed_interval(differences: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The Student-t interval of the mean of paired per-seed differences; None with fewer than two seeds."""
    n = len(differences)
    if n < 2:
        return None
    mean = float(np.mean(differences))
    half = _t(level, n) * float(np.std(differences, ddof=1)) / math.sqrt(n)
    return mean - half, mean + half


def detectable(sd: float, n: int, level: float = 0.95) -> float:
    """The smallest mean difference ``n`` paired seeds with differences' standard deviation ``sd`` decide: the
    seed interval's half-width (nan with fewer than two seeds)."""
    return _t(level, n) * sd / math.sqrt(n) if n >= 2 else math.nan


def _t(level: float, n: int) -> float:
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def class_interval(better: Sequence[dict], than: Sequence[dict], level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """The bootstrap interval over test classes of the mean over seeds of P@1(better) - P@1(than), in points.

    ``better``, ``than``: per seed (the same seeds, in order), the evaluate stage's per-class counts
    (``{"classes", "queries", "hits"}``, :func:`noisydml.evaluation.per_class.per_class_precision_at_1`). Each
    resample draws the test classes with replacement (multinomial weights, ``seed``), the same draw for every seed
    and both runs."""
    if not better or len(better) != len(than):
        raise ValueError(f"class_interval: {len(better)} and {len(than)} seeds; allowed: the same seeds, at least one")
    classes = better[0]["classes"]
    for counts in (*better, *than):
        if counts["classes"] != classes:
            raise ValueError("class_interval: the runs' test classes differ; paired runs must share a test set")
    weights = np.random.default_rng(seed).multinomial(len(classes), np.full(len(classes), 1 / len(classes)),
                                                      size=resamples).astype(np.float64)
    differences = np.zeros(resamples)
    for b, t in zip(better, than):
        differences += _p_at_1(weights, b) - _p_at_1(weights, t)
    differences *= 100 / len(better)
    tail = (1 - level) / 2
    low, high = np.quantile(differences, [tail, 1 - tail])
    return float(low), float(high)


def _p_at_1(weights: np.ndarray, counts: dict) -> np.ndarray:
    return (weights @ np.asarray(counts["hits"], np.float64)) / (weights @ np.asarray(counts["queries"], np.float64))


def verdict(seed_ci: tuple[float, float] | None, class_ci: tuple[float, float] | None) -> str:
    """:data:`HOLDS`, :data:`REVERSED` or :data:`UNDECIDED` (the module's rule); a missing interval decides
    nothing."""
    if seed_ci is None or class_ci is None:
        return UNDECIDED
    if seed_ci[0] > 0 and class_ci[0] > 0:
        return HOLDS
    if seed_ci[1] < 0 and class_ci[1] < 0:
        return REVERSED
    return UNDECIDED


def seed_verdict(seed_ci: tuple[float, float] | None) -> str:
    """:func:`verdict` where the seeds are the only source of variation judged (no held-out classes to resample)."""
    return verdict(seed_ci, seed_ci)


def interval_text(ci: tuple[float, float] | None, digits: int) -> str:
    return "–" if ci is None else f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"
