"""Precision@1 class by class: what a bootstrap over test classes resamples (:mod:`noisydml.reporting.uncertainty`).

Retrieval queries are not independent: the queries of one test class share a gallery, so a model that separates a
class well gets all its queries right together. An interval that treats queries as independent is too narrow; one
that resamples whole classes is not. The evaluate stage therefore records, per test class, how many queries it has
and how many of them have a same-class nearest neighbour; every run of a dataset has the same test classes, so two
runs' per-class counts pair up class by class.

The counts come from pytorch-metric-learning's own per-class Precision@1 (``AccuracyCalculator(return_per_class=
True)``) on the same search as :func:`noisydml.evaluation.retrieval.retrieval_metrics` (faiss's exact flat index,
the same k): the classes' hits sum to the run's P@1 times its queries, which :func:`per_class_precision_at_1`
checks.
"""

from __future__ import annotations

import numpy as np
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import FaissKNN

from noisydml.evaluation.retrieval import neighbours_used, same_label


def per_class_precision_at_1(embeddings, labels, recall_at=(), max_k: int = 1023, query_mask=None,
                             expected: float | None = None) -> dict[str, list[int]]:
    """``{"classes": [...], "queries": [...], "hits": [...]}``: per test class (sorted by label; classes whose
    queries have no same-class item to find are left out, as P@1 leaves them out), its queries and how many of
    them have a same-class nearest neighbour. ``expected``: the run's P@1, which the counts must reproduce."""
    emb = torch.nn.functional.normalize(torch.as_tensor(np.asarray(embeddings), dtype=torch.float32), dim=1)
    lab = torch.as_tensor(np.array(labels), dtype=torch.int64)
    k, _ = neighbours_used(lab.numpy(), recall_at, max_k, query_mask)
    calc = AccuracyCalculator(include=("precision_at_1",), k=k, return_per_class=True, device=torch.device("cpu"),
                              knn_func=FaissKNN(), label_comparison_fn=same_label)
    if query_mask is None:
        query_labels, gallery_labels = lab, lab
        per_class = calc.get_accuracy(emb, lab)["precision_at_1"]
    else:
        query = torch.as_tensor(np.array(query_mask, dtype=bool))
        query_labels, gallery_labels = lab[query], lab[~query]
        per_class = calc.get_accuracy(emb[query], lab[query], emb[~query], lab[~query],
                                      ref_includes_query=False)["precision_at_1"]
    # the library's not-lone queries: a same-class gallery item exists besides the query itself
    gallery_counts = torch.bincount(gallery_labels, minlength=int(lab.max()) + 1)
    findable = gallery_counts[query_labels] > (1 if query_mask is None else 0)
    classes, queries = torch.unique(query_labels[findable], return_counts=True)
    if len(per_class) != len(classes):
        raise RuntimeError(f"per-class P@1: {len(per_class)} classes from pytorch-metric-learning, {len(classes)} "
                           "with findable queries here")
    hits = [int(round(p * q)) for p, q in zip(per_class, queries.tolist())]
    total = sum(hits) / max(int(queries.sum()), 1)
    if expected is not None and abs(total - expected) > 1e-9:
        raise RuntimeError(f"per-class P@1: the classes' hits give {total:.6f}, the run's P@1 is {expected:.6f}")
    return {"classes": classes.tolist(), "queries": queries.tolist(), "hits": hits}
