import numpy as np
import pytest

from noisydml.evaluation.retrieval import metric_names, retrieval_metrics


def _points(positions, labels):
    """2-d unit vectors at the given angles (degrees): neighbours are fixed by the angles."""
    a = np.deg2rad(np.asarray(positions, float))
    return np.stack([np.cos(a), np.sin(a)], 1), np.asarray(labels)


def test_hand_computed_example():
    # Angles on a line: class 0 at 0,1,2 degrees; class 1 at 10, 11 and one sample at 1.5 (a stray).
    emb, labels = _points([0, 1, 2, 10, 11, 1.5], [0, 0, 0, 1, 1, 1])
    m = retrieval_metrics(emb, labels, recall_at=(1, 2, 4), nmi=False)
    # nearest neighbours: 0->1, 1->1.5(c1, wrong), 2->1.5(c1, wrong), 10->11, 11->10, 1.5->1 or 2 (c0, wrong)
    assert m["precision_at_1"] == pytest.approx(3 / 6)
    # recall@2: 0 (1, 1.5): yes; 1 (1.5, 0 or 2): yes; 2 (1.5, 1): yes; 10: yes; 11: yes; 1.5 (1|2, 2|1): no
    assert m["recall_at_2"] == pytest.approx(5 / 6)
    assert m["recall_at_4"] == pytest.approx(6 / 6)
    assert set(m) == {"precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "mean_average_precision_at_r", "r_precision"}
    assert m["recall_at_1"] == m["precision_at_1"]


def test_perfect_clusters_score_one():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 4)
    centres = rng.normal(size=(5, 8)) * 10
    emb = centres[labels] + rng.normal(size=(20, 8)) * 0.01
    m = retrieval_metrics(emb, labels)
    for name in metric_names((1, 2, 4, 8)):
        assert m[name] == pytest.approx(1.0), name


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 embeddings but 2 labels"):
        retrieval_metrics(np.ones((3, 2)), np.array([0, 1]))
