"""Retrieval evaluation. This package module is light (no torch, faiss): params validation uses it."""


def metric_names(recall_at) -> list[str]:
    """Names of every metric :func:`noisydml.evaluation.retrieval.retrieval_metrics` returns, in report order."""
    return ["precision_at_1", *[f"recall_at_{k}" for k in recall_at], "mean_average_precision_at_r", "r_precision", "nmi"]
