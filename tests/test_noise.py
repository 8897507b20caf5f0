import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noisydml.noise import corrupt_labels
from noisydml.noise.symmetric import symmetric_noise


def _labels(num_classes, per_class):
    return np.repeat(np.arange(num_classes), per_class)


def test_rate_zero_is_clean():
    labels = _labels(10, 5)
    assert np.array_equal(symmetric_noise(labels, 0.0, seed=3), labels)


@settings(max_examples=30, deadline=None)
@given(num_classes=st.integers(2, 50), per_class=st.integers(1, 40), rate=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
def test_symmetric_properties(num_classes, per_class, rate, seed):
    labels = _labels(num_classes, per_class)
    noisy = symmetric_noise(labels, rate, seed)
    assert noisy.min() >= 0 and noisy.max() < num_classes
    flipped = noisy != labels
    n = len(labels)
    # actual rate within 5 binomial standard deviations (plus rounding slack)
    assert abs(flipped.mean() - rate) <= 5 * np.sqrt(rate * (1 - rate) / n) + 1e-9
    assert np.array_equal(symmetric_noise(labels, rate, seed), noisy), "deterministic by seed"


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), rates=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4))
def test_symmetric_noise_is_nested_across_rates(seed, rates):
    labels = _labels(20, 30)
    flipped = {r: symmetric_noise(labels, r, seed) != labels for r in rates}
    for lo in rates:
        for hi in rates:
            if lo <= hi:
                assert not np.any(flipped[lo] & ~flipped[hi])


def test_corrupt_labels_table_and_stats():
    labels = _labels(10, 100)
    table, stats = corrupt_labels(np.arange(1000) + 7, labels, {"kind": "symmetric", "rate": 0.5, "seed": 0})
    assert list(table.columns) == ["sample_id", "label", "true_label", "is_noisy"]
    assert table["sample_id"].iloc[0] == 7
    assert (table["is_noisy"] == (table["label"] != table["true_label"])).all()
    assert stats["num_noisy"] == table["is_noisy"].sum()
    assert 0.45 < stats["actual_rate"] < 0.55
    assert sum(stats["flips_per_class"]) == stats["num_noisy"]
    assert stats["num_classes_before"] == stats["num_classes_after"] == 10


def test_none_keeps_labels():
    labels = _labels(4, 3)
    table, stats = corrupt_labels(np.arange(12), labels, {"kind": "none"})
    assert stats["actual_rate"] == 0.0 and (table["label"] == labels).all()


def test_single_class_cannot_flip():
    with pytest.raises(ValueError, match="at least 2 classes"):
        symmetric_noise(np.zeros(5, int), 0.5, 0)
