"""Noise generators: properties over random label sets (hypothesis), statistics, and bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noisydml.noise import NoiseInputError, NoiseInputs, corrupt_labels
from noisydml.noise.small_cluster import dissolution_order, dissolved_classes, small_cluster_noise
from noisydml.noise.symmetric import flips_per_class, symmetric_noise, symmetric_per_class_noise


def _labels(num_classes, per_class):
    return np.repeat(np.arange(num_classes), per_class)


@st.composite
def label_sets(draw, min_classes=2, max_classes=40, min_size=2, max_size=15):
    """Random class sizes, samples in a random order (labels 0..C-1, every class present)."""
    sizes = draw(st.lists(st.integers(min_size, max_size), min_size=min_classes, max_size=max_classes))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    order = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(len(labels))
    return labels[order]


def _features(labels, dim=8, seed=0):
    """Features with class structure plus noise, so k-means has something to cut."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((labels.max() + 1, dim))
    return (centres[labels] + 0.5 * rng.standard_normal((len(labels), dim))).astype(np.float32)


rates = st.floats(0.0, 1.0, allow_nan=False)
seeds = st.integers(0, 2**31)

# --------------------------------------------------------------------------- symmetric


def test_rate_zero_is_clean():
    labels = _labels(10, 5)
    assert np.array_equal(symmetric_noise(labels, 0.0, seed=3), labels)
    assert np.array_equal(symmetric_per_class_noise(labels, 0.0, seed=3), labels)


@settings(max_examples=40, deadline=None)
@given(labels=label_sets(), rate=rates, seed=seeds)
def test_symmetric_properties(labels, rate, seed):
    noisy = symmetric_noise(labels, rate, seed)
    assert noisy.min() >= 0 and noisy.max() <= labels.max()
    flipped = noisy != labels
    n = len(labels)
    # actual rate within 5 binomial standard deviations (plus rounding slack)
    assert abs(flipped.mean() - rate) <= 5 * np.sqrt(rate * (1 - rate) / n) + 1e-9
    assert np.array_equal(symmetric_noise(labels, rate, seed), noisy), "deterministic by seed"


@pytest.mark.parametrize("generator", [symmetric_noise, symmetric_per_class_noise])
@settings(max_examples=30, deadline=None)
@given(labels=label_sets(), seed=seeds, rates=st.lists(rates, min_size=2, max_size=4))
def test_symmetric_kinds_are_nested_across_rates(generator, labels, seed, rates):
    flipped = {r: generator(labels, r, seed) != labels for r in rates}
    for lo in rates:
        for hi in rates:
            if lo <= hi:
                assert not np.any(flipped[lo] & ~flipped[hi])


# --------------------------------------------------------------------------- symmetric per class


@settings(max_examples=40, deadline=None)
@given(labels=label_sets(), rate=rates, seed=seeds)
def test_symmetric_per_class_flips_exactly_round_rate_n(labels, rate, seed):
    noisy = symmetric_per_class_noise(labels, rate, seed)
    assert noisy.min() >= 0 and noisy.max() <= labels.max()
    sizes = np.bincount(labels)
    flips = np.bincount(labels[noisy != labels], minlength=len(sizes))
    expected = np.minimum(np.maximum(np.floor(rate * sizes + 0.5), 1 if rate > 0 else 0), sizes)
    assert np.array_equal(flips, expected)
    assert np.array_equal(symmetric_per_class_noise(labels, rate, seed), noisy)


def test_flips_per_class_rounds_half_up_and_flips_at_least_one():
    assert flips_per_class(np.array([4, 5, 3, 2]), 0.5).tolist() == [2, 3, 2, 1]
    assert flips_per_class(np.array([10, 2]), 0.01).tolist() == [1, 1]
    assert flips_per_class(np.array([10, 2]), 0.0).tolist() == [0, 0]


def test_new_labels_are_uniform_over_other_classes():
    labels = _labels(5, 4000)
    noisy = symmetric_per_class_noise(labels, 0.5, seed=1)
    moved_from_0 = noisy[(labels == 0) & (noisy != labels)]
    share = np.bincount(moved_from_0, minlength=5)[1:] / len(moved_from_0)
    assert np.allclose(share, 0.25, atol=0.04)


def test_single_class_cannot_flip():
    with pytest.raises(ValueError, match="at least 2 classes"):
        symmetric_noise(np.zeros(5, int), 0.5, 0)


# --------------------------------------------------------------------------- small cluster

small_cluster_rates = st.floats(0.0, 0.9, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(labels=label_sets(min_classes=3), rate=small_cluster_rates, seed=seeds)
def test_small_cluster_properties(labels, rate, seed):
    feats = _features(labels)
    sizes = np.bincount(labels)
    try:
        result = small_cluster_noise(labels, rate, seed, feats)
    except NoiseInputError as e:
        # only allowed when the rate needs every class: all but the last class in the order fall short
        assert "would dissolve every one" in str(e)
        order = dissolution_order(np.unique(labels), seed)
        assert sizes[order[:-1]].sum() < rate * len(labels)
        return
    noisy, dissolved = result.labels, set(result.dissolved.tolist())
    was_dissolved = np.isin(labels, list(dissolved))
    assert noisy.min() >= 0 and noisy.max() <= labels.max()
    # no dissolved class survives, every image of one is moved, never back to where it came from
    assert not np.isin(noisy, list(dissolved)).any()
    assert np.all(noisy[was_dissolved] != labels[was_dissolved])
    # every kept class keeps all its own images
    assert np.array_equal(noisy[~was_dissolved], labels[~was_dissolved])
    # dissolution stops as soon as rate * N images are dissolved
    moved = was_dissolved.sum()
    assert moved >= rate * len(labels) - 1e-6
    if len(dissolved):
        last = result.dissolved[-1]
        assert moved - sizes[last] < rate * len(labels)
    # clusters: at most floor(n/2) per dissolved class, covering exactly the moved images
    assert result.cluster_sizes.sum() == moved
    assert len(result.cluster_sizes) <= sum(sizes[c] // 2 for c in dissolved)
    assert np.array_equal(small_cluster_noise(labels, rate, seed, feats).labels, noisy), "deterministic by seed"


@settings(max_examples=30, deadline=None)
@given(labels=label_sets(min_classes=4), seed=seeds, rates=st.lists(small_cluster_rates, min_size=2, max_size=4))
def test_small_cluster_dissolved_classes_are_nested(labels, seed, rates):
    dissolved = {}
    for r in rates:
        try:
            dissolved[r] = set(dissolved_classes(labels, r, seed).tolist())
        except NoiseInputError:
            continue
    for lo in dissolved:
        for hi in dissolved:
            if lo <= hi:
                assert dissolved[lo] <= dissolved[hi]


def test_small_cluster_moves_whole_clusters_and_matches_papers_class_counts():
    # CUB-like: 100 classes of ~59 images; 25% dissolves 25 classes, 50% dissolves 50
    labels = _labels(100, 59)
    feats = _features(labels)
    for rate, kept in ((0.25, 75), (0.5, 50)):
        result = small_cluster_noise(labels, rate, 0, feats)
        assert len(np.unique(result.labels)) == kept
    # the clusters are k-means cells: images of one cluster go together
    result = small_cluster_noise(labels, 0.5, 0, feats)
    assert result.cluster_sizes.mean() == pytest.approx(59 / 29, rel=0.01)


def test_small_cluster_rate_that_needs_every_class_is_refused():
    labels = _labels(4, 10)
    with pytest.raises(NoiseInputError, match="would dissolve every one of the 4 classes"):
        small_cluster_noise(labels, 0.8, 0, _features(labels))


def test_small_cluster_refuses_single_image_class_and_bad_features():
    labels = np.array([0, 0, 1, 1, 2])
    with pytest.raises(NoiseInputError, match="class 2 has a single image"):
        small_cluster_noise(labels, 0.3, 0, _features(labels))
    labels = _labels(5, 4)
    with pytest.raises(NoiseInputError, match="do not match 20 labels"):
        small_cluster_noise(labels, 0.3, 0, np.zeros((19, 3)))
    bad = _features(labels)
    bad[3, 1] = np.nan
    with pytest.raises(NoiseInputError, match="NaN"):
        small_cluster_noise(labels, 0.3, 0, bad)


# --------------------------------------------------------------------------- corrupt_labels and statistics


def _inputs(labels):
    feats = _features(labels)
    return NoiseInputs(features=lambda cfg: (feats, {"source": "test"}))


def test_corrupt_labels_table_and_stats():
    labels = _labels(10, 100)
    table, per_class, stats = corrupt_labels(np.arange(1000) + 7, labels, {"kind": "symmetric", "rate": 0.5, "seed": 0})
    assert list(table.columns) == ["sample_id", "label", "true_label", "is_noisy"]
    assert table["sample_id"].iloc[0] == 7
    assert (table["is_noisy"] == (table["label"] != table["true_label"])).all()
    assert stats["num_noisy"] == table["is_noisy"].sum() == per_class["flipped_out"].sum() == per_class["foreign"].sum()
    assert 0.45 < stats["actual_rate"] < 0.55
    assert sum(stats["flips_per_class_histogram"].values()) == 10
    assert stats["num_classes_before"] == stats["num_classes_after"] == 10


def test_small_cluster_relabels_remaining_classes_densely():
    labels = _labels(20, 6)
    cfg = {"kind": "small_cluster", "rate": 0.5, "seed": 0, "features": {"source": "pixels"}}
    table, per_class, stats = corrupt_labels(np.arange(120), labels, cfg, _inputs(labels))
    assert stats["num_classes_before"] == 20 and stats["num_classes_after"] == 10
    assert sorted(table["label"].unique()) == list(range(10))
    assert table["true_label"].max() == 19
    dissolved = per_class.loc[per_class["label"] < 0, "true_label"].to_numpy()
    assert len(dissolved) == stats["num_dissolved_classes"] == 10
    moved = table["true_label"].isin(dissolved)
    assert (table["is_noisy"] == moved.astype(int)).all()
    # a kept class's own images carry its new label
    kept = per_class[per_class["label"] >= 0].set_index("true_label")["label"]
    own = table[~moved]
    assert (own["label"].to_numpy() == kept.loc[own["true_label"]].to_numpy()).all()
    clusters = stats["moved_clusters"]
    assert sum(int(k) * v for k, v in clusters["size_histogram"].items()) == moved.sum()
    assert stats["features"] == {"source": "test"}
    assert per_class.loc[per_class["label"] >= 0, "labelled"].sum() == 120


def test_none_keeps_labels():
    labels = _labels(4, 3)
    table, _, stats = corrupt_labels(np.arange(12), labels, {"kind": "none"})
    assert stats["actual_rate"] == 0.0 and (table["label"] == labels).all()
    assert "verified" not in stats


def test_none_reports_verified_noise():
    labels = _labels(2, 4)
    is_clean = np.array([1, 0, np.nan, 1, 0, 0, np.nan, np.nan])
    table, per_class, stats = corrupt_labels(np.arange(8), labels, {"kind": "none"}, NoiseInputs(is_clean=is_clean))
    assert (table["label"] == labels).all()
    assert table["is_noisy"].tolist() == [0, 1, 0, 0, 1, 1, 0, 0]
    assert stats["verified"]["num_verified"] == 5 and stats["verified"]["num_verified_noisy"] == 3
    assert stats["verified"]["estimated_rate"] == pytest.approx(0.6)
    assert per_class["flipped_out"].tolist() == [1, 2]


def test_per_class_kinds_refuse_single_image_classes_by_name():
    labels = np.array([0, 0, 1, 2, 2])
    with pytest.raises(NoiseInputError, match=r"class 1 \('b'\) has 1 training image"):
        corrupt_labels(np.arange(5), labels, {"kind": "symmetric_per_class", "rate": 0.5, "seed": 0},
                       class_names=["a", "b", "c"])
    # symmetric noise has no such need
    corrupt_labels(np.arange(5), labels, {"kind": "symmetric", "rate": 0.5, "seed": 0})
