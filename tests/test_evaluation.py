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


def _on_circle(degrees):
    a = np.deg2rad(np.asarray(degrees, dtype=float))
    return np.stack([np.cos(a), np.sin(a)], axis=1).astype(np.float32)


def test_map_at_r_r_precision_and_recall_against_hand_computed_values():
    """Class 0 at 0, 33, 100 degrees; class 1 at 20, 60, 78 (no ties). R = 2 for every query.

    Top-2 neighbours (relevant = same class): 0 -> [20 no, 33 yes]: AP = (0 + 1/2) / 2 = 0.25, RP = 1/2;
    33 -> [20, 60] no, no; 100 -> [78, 60] no, no; 20 -> [33, 0] no, no; 60 -> [78 yes, 33 no]: AP = 1/2;
    78 -> [60 yes, 100 no]: AP = 1/2. MAP@R = 1.25 / 6, R-Precision = 1.5 / 6, P@1 = 2 / 6.
    Recall@4: 0 yes, 33 yes (0 is 4th), 100 yes (33 3rd), 20 yes (60 4th), 60 yes, 78 yes = 1.
    """
    emb = _on_circle([0, 33, 100, 20, 60, 78])
    labels = np.array([0, 0, 0, 1, 1, 1])
    m = retrieval_metrics(emb, labels, recall_at=(1, 2, 4), nmi=False)
    assert m["mean_average_precision_at_r"] == pytest.approx(1.25 / 6)
    assert m["r_precision"] == pytest.approx(1.5 / 6)
    assert m["precision_at_1"] == pytest.approx(2 / 6) == pytest.approx(m["recall_at_1"])
    assert m["recall_at_2"] == pytest.approx(3 / 6)  # 0 (33 2nd), 60, 78
    assert m["recall_at_4"] == pytest.approx(1.0)


def test_nmi_matches_scikit_learn_on_a_known_clustering():
    """Three far-apart locations, so k-means (3 clusters = 3 test classes) finds exactly them."""
    from sklearn.metrics import normalized_mutual_info_score

    rng = np.random.default_rng(0)
    emb = np.repeat(_on_circle([0, 120, 240]), 2, axis=0) + rng.normal(0, 1e-3, (6, 2)).astype(np.float32)
    labels = np.array([0, 0, 1, 1, 1, 2])
    m = retrieval_metrics(emb, labels, recall_at=(1,), nmi=True)
    expected = normalized_mutual_info_score(labels, [0, 0, 1, 1, 2, 2])
    assert 0 < expected < 1 and m["nmi"] == pytest.approx(expected)


def test_max_k_below_the_largest_class_is_flagged():
    from noisydml.evaluation.retrieval import neighbours_used

    labels = np.repeat([0, 1], [11, 3])
    assert neighbours_used(labels, (1, 2), max_k=1023) == (10, True)
    assert neighbours_used(labels, (1, 2), max_k=5) == (5, False)


def test_recall_at_above_max_k_is_refused(raw_params):
    from noisydml.config import ParamsError, validate_params

    raw_params["evaluate"].update(max_k=4, recall_at=[1, 8])
    with pytest.raises(ParamsError, match=r"evaluate.recall_at\[1\]: Recall@8 needs 8 neighbours, above evaluate.max_k"):
        validate_params(raw_params)


def test_search_device_auto_falls_back_to_the_cpu_and_says_so(capsys):
    import torch

    from noisydml.evaluation import retrieval

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: auto may pick the GPU")
    assert retrieval.search_device("cpu") == torch.device("cpu")
    retrieval._SAID.clear()
    assert retrieval.search_device("auto") == torch.device("cpu")
    assert "evaluate.device auto: no CUDA device; searching on the CPU" in capsys.readouterr().out
    rng = np.random.default_rng(0)
    emb, labels = rng.normal(size=(40, 8)).astype(np.float32), np.repeat(np.arange(8), 5)
    assert retrieval.retrieval_metrics(emb, labels, device="auto") == retrieval.retrieval_metrics(emb, labels)
    with pytest.raises(RuntimeError, match="evaluate.device: 'cuda', but torch sees no CUDA device here"):
        retrieval.search_device("cuda")


@pytest.mark.parametrize("k", [1, 5, 99, 100, 101, 1023])
def test_torch_knn_returns_faiss_l2_neighbours_ties_included(k):
    """Exactly representable vectors (small integers): every distance is exact, so ties are real and plentiful;
    the torch search must pick and order them as faiss's IndexFlatL2 does ((distance, index) order), whatever
    its block size."""
    import faiss
    import torch
    from pytorch_metric_learning.utils.inference import FaissKNN

    from noisydml.evaluation.retrieval import TorchKNN
    from noisydml.neighbours import exact_topk

    x = np.random.default_rng(0).integers(-2, 3, (3000, 8)).astype(np.float32)
    index = faiss.IndexFlatL2(8)
    index.add(x)
    distances, ids = index.search(x, k)
    for block_bytes in (1 << 30, 1 << 18):  # one block; 4 query rows a block
        d, i = exact_topk(torch.from_numpy(x), torch.from_numpy(x), k, "l2", block_bytes=block_bytes)
        assert np.array_equal(i.numpy(), ids) and np.array_equal(d.numpy(), distances)
    # through pytorch-metric-learning's knn_func interface, the query excluded from its own neighbours
    xt = torch.from_numpy(x)
    d1, i1 = FaissKNN()(xt, k, xt, True)
    d2, i2 = TorchKNN(block_bytes=1 << 20)(xt, k, xt, True)
    assert torch.equal(i1, i2) and torch.equal(d1, d2)


def test_torch_inner_product_search_takes_the_lowest_tied_indices():
    import torch

    from noisydml.neighbours import exact_topk

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.5, 0.0]])
    scores, index = exact_topk(x[:1], x, 2, "ip")
    assert index.tolist() == [[0, 2]] and scores.tolist() == [[1.0, 1.0]]
    scores, index = exact_topk(x[:1], x, 4, "ip")
    assert index.tolist() == [[0, 2, 3, 4]]
    with pytest.raises(ValueError, match="metric 'cos'; allowed: l2, ip"):
        exact_topk(x, x, 1, "cos")


def test_torch_search_gives_faiss_metrics_on_trained_like_embeddings():
    """Clustered embeddings (as a trained model's): the torch search's metrics against faiss's. Distances differ in
    the last float bits (another product kernel), so only near-ties may swap: P@1 and Recall@K equal, the
    rank-averaged metrics within 1e-4."""
    from noisydml.evaluation.retrieval import retrieval_metrics

    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(60), 25)
    centres = rng.normal(size=(60, 32))
    emb = (centres[labels] + 0.6 * rng.normal(size=(len(labels), 32))).astype(np.float32)
    faiss_metrics = retrieval_metrics(emb, labels, recall_at=(1, 2, 4, 8), nmi=False)
    torch_metrics = retrieval_metrics(emb, labels, recall_at=(1, 2, 4, 8), nmi=False, knn="torch")
    assert faiss_metrics.keys() == torch_metrics.keys()
    for name, value in faiss_metrics.items():
        assert torch_metrics[name] == pytest.approx(value, abs=1e-4), name
    for name in ("precision_at_1", "recall_at_1", "recall_at_8"):
        assert torch_metrics[name] == faiss_metrics[name]


def test_per_class_counts_sum_to_the_runs_precision_at_1():
    # the hand-computed example: class 0 finds 1 of 3 (0 -> 1), class 1 finds 2 of 3 (10 <-> 11)
    from noisydml.evaluation.per_class import per_class_precision_at_1

    emb, labels = _points([0, 1, 2, 10, 11, 1.5], [0, 0, 0, 1, 1, 1])
    counts = per_class_precision_at_1(emb, labels, expected=0.5)
    assert counts == {"classes": [0, 1], "queries": [3, 3], "hits": [1, 2]}
    # a random test set, all-vs-all and query/gallery: the counts reproduce P@1 (checked inside) and leave out
    # the classes whose queries have nothing to find (a class of one image)
    rng = np.random.default_rng(0)
    labels = np.r_[np.repeat(np.arange(30), 5), [30]]
    emb = rng.normal(size=(len(labels), 8))
    counts = per_class_precision_at_1(emb, labels, expected=retrieval_metrics(emb, labels, nmi=False)["precision_at_1"])
    assert counts["classes"] == list(range(30)) and sum(counts["queries"]) == 150
    query = np.arange(len(labels)) % 2 == 0
    p1 = retrieval_metrics(emb, labels, nmi=False, query_mask=query)["precision_at_1"]
    with pytest.raises(RuntimeError, match="the run's P@1"):
        per_class_precision_at_1(emb, labels, query_mask=query, expected=p1 + 0.01)
    assert sum(per_class_precision_at_1(emb, labels, query_mask=query, expected=p1)["queries"]) == 75
