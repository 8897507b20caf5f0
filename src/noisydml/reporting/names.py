"""What a reader sees instead of our ids: noise settings and metrics as the papers name them, numbers in % with one
number of decimals per column, and a dash with a footnote where there is no number.

CSV files keep the ids (``sym50``, ``precision_at_1``: what a script joins on); the Markdown and LaTeX tables and
the figures use these names.
"""

from __future__ import annotations

import math

import pandas as pd

#: Noise models as the papers name them (``noise.<name>.kind``; a published list: its ``noise_model``).
NOISE_MODELS = {"symmetric": "symmetric", "symmetric_per_class": "symmetric per class",
                "small_cluster": "small-cluster", "real": "real"}
#: Metrics as papers print them.
METRICS = {"precision_at_1": "P@1", "mean_average_precision_at_r": "MAP@R", "r_precision": "RP", "nmi": "NMI"}
#: The trainer's scores of a method's decisions, as the report heads them (shares, shown in %).
DIAGNOSTICS = {"final_diag_selection_precision": "selection precision", "final_diag_selection_recall":
               "selection recall", "final_diag_kept_fraction": "kept", "clean_fraction": "clean labels"}
#: Written where a table has no number; :data:`DASH_NOTE` says why under the table.
DASH = "–"
DASH_NOTE = f"{DASH}: not run (this row has no run at this setting)"
#: Decimals of every percentage the report prints (the papers print two).
DIGITS = 2


#: Face verification metrics as the papers head their columns.
VERIFICATION_NAMES = {"lfw_accuracy": "LFW", "cfp_fp_accuracy": "CFP-FP", "agedb_30_accuracy": "AgeDB-30"}


def metric_name(metric: str) -> str:
    """``precision_at_1`` -> ``P@1``, ``recall_at_4`` -> ``R@4``, ``ijbc_tar_at_far_1e-05`` -> ``IJB-C TAR@1e-05``,
    a diagnostic -> its words."""
    if metric in DIAGNOSTICS:
        return DIAGNOSTICS[metric]
    if metric in VERIFICATION_NAMES:
        return VERIFICATION_NAMES[metric]
    if "_tar_at_far_" in metric:
        ijb, far = metric.split("_tar_at_far_")
        return f"{ijb.upper().replace('IJB', 'IJB-')} TAR@{float(far):.0e}"
    return METRICS.get(metric, metric.replace("recall_at_", "R@"))


def noise_name(stats: dict, real_labels: bool = False) -> str:
    """A noise setting as a paper names it, from the corrupt stage's ``stats.json``: ``50% symmetric``,
    ``50% small-cluster``, ``clean labels`` (a dataset whose own labels are noisy: ``real noise``); a published list
    and small-cluster noise clustered on a run's embeddings say so."""
    kind = stats["kind"]
    if kind == "none":
        return "real noise" if real_labels else "clean labels"
    settings = stats.get("settings", {})
    model = settings.get("noise_model", kind) if kind == "published_list" else kind
    text = f"{100 * stats['nominal_rate']:g}% {NOISE_MODELS.get(model, model.replace('_', ' '))}"
    if kind == "published_list":
        return text + " (published list)"
    if settings.get("features", {}).get("source") == "run":
        return text + " (clusters of a run's embeddings)"
    return text


def percent(value: float | None, digits: int = DIGITS) -> str:
    """A share in [0, 1] as a percentage with ``digits`` decimals; :data:`DASH` for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return f"{100 * value:.{digits}f}"


def named_table(table: pd.DataFrame, run_labels: dict[str, str],
                noise_names: dict[tuple[str, str], str]) -> pd.DataFrame:
    """``table`` with its ``noise`` ids (beside its ``dataset``) and ``method`` (run) names as a reader names them."""
    out = table.copy()
    if {"dataset", "noise"} <= set(out.columns):
        out["noise"] = [noise_names.get((d, n), n) for d, n in zip(out["dataset"], out["noise"])]
    if "method" in out.columns:
        out["method"] = [run_labels.get(m, m) for m in out["method"]]
    return out
