"""Retrieval evaluation. This package module is light (no torch, faiss): params validation uses it."""

from __future__ import annotations

from typing import Any

from noisydml.schema import Field, ParamsError, SectionCheck, check_section

EVALUATE_SCHEMA = {
    "recall_at": Field(list, [1, 2, 4, 8], item_type=int, min=1),
    "max_k": Field(int, 1023, min=1, help="cap on neighbours retrieved for MAP@R and R-Precision"),
    "device": Field(str, "cpu", choices=("cpu", "auto", "cuda"),
                    help="ours: where the neighbours are searched: cpu = faiss; cuda = an exact blocked torch search "
                         "on the GPU (no faiss GPU build needed; faiss's ties, distances may differ in the last "
                         "float bits); auto = cuda when present, else cpu"),
    "nmi": Field(bool, True),
    "tar_reading": Field(str, "strict", choices=("strict", "insightface"),
                         help="face verification's TAR at FAR: strict = ours, the largest ROC point with FAR <= f; "
                              "insightface = the ROC point nearest f (eval_ijbc.py's; may lie above f), for tables "
                              "beside published ones. Both are written; this one is tar_at_far_<f>"),
}


def evaluate_settings(evaluate: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``evaluate`` section validated, with the schema's defaults for every key it leaves out."""
    return check_section(evaluate or {}, EVALUATE_SCHEMA, "evaluate")


def metric_names(recall_at) -> list[str]:
    """Names of every metric :func:`noisydml.evaluation.retrieval.retrieval_metrics` returns, in report order."""
    return ["precision_at_1", *[f"recall_at_{k}" for k in recall_at], "mean_average_precision_at_r", "r_precision", "nmi"]


def _check_evaluate(section: Any, p: dict[str, Any], raw) -> dict[str, Any]:
    evaluate = check_section(section, EVALUATE_SCHEMA, "evaluate")
    for i, k in enumerate(evaluate["recall_at"]):
        if k > evaluate["max_k"]:
            raise ParamsError(f"evaluate.recall_at[{i}]: Recall@{k} needs {k} neighbours, above evaluate.max_k "
                              f"({evaluate['max_k']}); allowed: 1..{evaluate['max_k']}")
    return evaluate


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS = {"evaluate": SectionCheck(_check_evaluate)}
