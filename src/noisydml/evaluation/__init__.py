"""Retrieval evaluation. This package module is light (no torch, faiss): params validation uses it."""

from __future__ import annotations

from typing import Any

from noisydml.schema import Field, check_section

EVALUATE_SCHEMA = {
    "recall_at": Field(list, [1, 2, 4, 8], item_type=int, min=1),
    "max_k": Field(int, 1023, min=1, help="cap on neighbours retrieved for MAP@R and R-Precision"),
    "device": Field(str, "cpu", choices=("cpu", "auto"),
                    help="ours: where faiss searches and clusters; auto = the GPU when CUDA and faiss-gpu are both "
                         "present (GPU results may differ from the CPU's in ties and the last float bits)"),
    "nmi": Field(bool, True),
}


def evaluate_settings(evaluate: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``evaluate`` section validated, with the schema's defaults for every key it leaves out."""
    return check_section(evaluate or {}, EVALUATE_SCHEMA, "evaluate")


def metric_names(recall_at) -> list[str]:
    """Names of every metric :func:`noisydml.evaluation.retrieval.retrieval_metrics` returns, in report order."""
    return ["precision_at_1", *[f"recall_at_{k}" for k in recall_at], "mean_average_precision_at_r", "r_precision", "nmi"]
