"""The orderings' verdict rule (noisydml.reporting.uncertainty): decided by a 95% interval over seeds and one over
test classes, never by the sign of a mean. Constructed cases: a one-query margin is undecided; a clear margin
holds; its mirror is reversed; one seed decides nothing."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from noisydml.reporting import uncertainty

CLASSES, QUERIES = 200, 32  # glyphs' test split: 200 classes of 32 images, 6,400 queries


def _run(rng: np.random.Generator) -> dict:
    """A run's per-class counts with P@1 near 0.6 (per-class rates spread as a real model's are)."""
    rates = rng.beta(6, 4, CLASSES)
    return {"classes": list(range(CLASSES)), "queries": [QUERIES] * CLASSES,
            "hits": rng.binomial(QUERIES, rates).tolist()}


def _plus(counts: dict, extra: dict[int, int]) -> dict:
    hits = list(counts["hits"])
    for c, k in extra.items():
        hits[c] = min(max(hits[c] + k, 0), QUERIES)
    return {**counts, "hits": hits}


def _p1(counts: dict) -> float:
    return 100 * sum(counts["hits"]) / sum(counts["queries"])


def test_the_seed_interval_is_students_t_of_the_paired_differences():
    diffs = [0.8, -0.2, 1.1]
    low, high = uncertainty.seed_interval(diffs)
    expected = stats.t.interval(0.95, 2, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert (low, high) == pytest.approx(expected)
    assert uncertainty.seed_interval([0.5]) is None
    assert uncertainty.detectable(np.std(diffs, ddof=1), 3) == pytest.approx((high - low) / 2)


def test_a_one_query_margin_is_undecided_on_every_seed():
    # the better run finds one more query than its baseline at each of three seeds: every per-seed difference is
    # positive and identical (sd 0: the seed interval alone would call it), yet the classes decide nothing
    rng = np.random.default_rng(0)
    than = [_run(rng) for _ in range(3)]
    better = [_plus(t, {7: 1}) for t in than]
    diffs = [_p1(b) - _p1(t) for b, t in zip(better, than)]
    assert diffs == pytest.approx([100 / 6400] * 3) and all(d > 0 for d in diffs)
    seed_ci = uncertainty.seed_interval(diffs)
    class_ci = uncertainty.class_interval(better, than)
    assert seed_ci[0] > 0 and class_ci[0] <= 0 <= class_ci[1]
    assert uncertainty.verdict(seed_ci, class_ci) == uncertainty.UNDECIDED


def test_the_case_of_the_docs_sgps_above_prism_is_undecided():
    # docs/ablations.md's former claim: above on every seed, by one query at seed 1 (3,827 vs 3,826 of 6,400)
    rng = np.random.default_rng(1)
    than = [_run(rng) for _ in range(3)]
    better = [_plus(than[0], {3: 2, 50: 1}), _plus(than[1], {9: 1}), _plus(than[2], {4: 3, 90: -1})]
    diffs = [_p1(b) - _p1(t) for b, t in zip(better, than)]
    assert all(d > 0 for d in diffs)
    verdict = uncertainty.verdict(uncertainty.seed_interval(diffs), uncertainty.class_interval(better, than))
    assert verdict == uncertainty.UNDECIDED


def test_a_clear_margin_holds_and_its_mirror_is_reversed():
    rng = np.random.default_rng(2)
    than = [_run(rng) for _ in range(3)]
    # 3-6 more hits in each of 40 classes (~3 points), by seed
    better = [_plus(t, {c: 3 + (c + s) % 4 for c in range(0, CLASSES, 5)}) for s, t in enumerate(than)]
    diffs = [_p1(b) - _p1(t) for b, t in zip(better, than)]
    held = uncertainty.verdict(uncertainty.seed_interval(diffs), uncertainty.class_interval(better, than))
    assert held == uncertainty.HOLDS
    mirrored = uncertainty.verdict(uncertainty.seed_interval([-d for d in diffs]),
                                   uncertainty.class_interval(than, better))
    assert mirrored == uncertainty.REVERSED


def test_one_seed_decides_nothing_and_the_bootstrap_is_reproducible():
    rng = np.random.default_rng(3)
    than = [_run(rng)]
    better = [_plus(than[0], {c: 10 for c in range(CLASSES)})]  # ~31 points above
    class_ci = uncertainty.class_interval(better, than)
    assert class_ci[0] > 20
    assert uncertainty.verdict(uncertainty.seed_interval([_p1(better[0]) - _p1(than[0])]), class_ci) == \
        uncertainty.UNDECIDED
    assert uncertainty.class_interval(better, than, seed=5) == uncertainty.class_interval(better, than, seed=5)


def test_runs_on_different_test_classes_are_refused():
    rng = np.random.default_rng(4)
    a, b = _run(rng), _run(rng)
    b = {**b, "classes": [c + 1 for c in b["classes"]]}
    with pytest.raises(ValueError, match="test classes differ"):
        uncertainty.class_interval([a], [b])
