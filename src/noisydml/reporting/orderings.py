"""The orderings the papers claim (a study's :class:`~noisydml.studies.base.Claim`: its method above its baseline),
checked with their uncertainty: for every dataset and noise setting of the grid where both rows ran, the per-seed
paired difference (the same seed trains both on the same labels), a 95% interval of its mean over seeds (paired t)
and one over test classes (a bootstrap, queries clustered by class), and a verdict decided by the two intervals
(:mod:`noisydml.reporting.uncertainty`), never by the sign of a mean. With one seed the class interval is shown and
no ordering is claimed.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd

from noisydml.reporting import uncertainty
from noisydml.reporting.names import DIGITS, metric_name

#: A claim's verdict (:func:`noisydml.reporting.uncertainty.verdict`).
HOLDS, REVERSED, OPEN = uncertainty.HOLDS, uncertainty.REVERSED, uncertainty.UNDECIDED
RULE = uncertainty.RULE
ONE_SEED = "one seed: no ordering is claimed"
#: The metric the per-class counts (and so the bootstrap over classes) are of.
CLASS_METRIC = "precision_at_1"


def paired(per_seed: pd.DataFrame, claims: Iterable, metric: str, noise_names: dict[tuple[str, str], str],
           label, settings: dict | None = None) -> pd.DataFrame:
    """One row per (claim, dataset, noise) where both runs have a seed in common: the per-seed differences in
    points of ``metric`` (%), their mean and sd, how many seeds agree, the interval over seeds and (``metric`` P@1,
    counts recorded) over test classes, and the verdict. ``label``: run -> row label. ``settings``:
    ``report.uncertainty`` (level, resamples, seed)."""
    settings = settings or {"level": 0.95, "resamples": 2000, "seed": 0}
    columns = ["study", "claim", "better", "than", "dataset", "noise", "noise_name", "metric", "seeds",
               "differences", "mean", "sd", "seed_low", "seed_high", "class_low", "class_high", "detectable",
               "agree", "verdict"]
    if per_seed.empty or metric not in per_seed:
        return pd.DataFrame(columns=columns)
    indexed = per_seed.set_index(["dataset", "noise", "method", "seed"])
    values = indexed[metric]
    counts = indexed["per_class_precision_at_1"] if "per_class_precision_at_1" in indexed else None
    rows = []
    for study, claim in claims:
        for (dataset, noise), group in per_seed.groupby(["dataset", "noise"], sort=False):
            seeds = sorted(set(group.loc[group["method"] == claim.better, "seed"])
                           & set(group.loc[group["method"] == claim.than, "seed"]))
            if not seeds:
                continue
            diffs = [100 * (float(values[dataset, noise, claim.better, s]) - float(values[dataset, noise, claim.than, s]))
                     for s in seeds]
            mean = sum(diffs) / len(diffs)
            sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else math.nan
            seed_ci = uncertainty.seed_interval(diffs, settings["level"])
            class_ci = None
            if metric == CLASS_METRIC and counts is not None:
                b = [counts[dataset, noise, claim.better, s] for s in seeds]
                t = [counts[dataset, noise, claim.than, s] for s in seeds]
                if all(isinstance(c, dict) for c in (*b, *t)):
                    class_ci = uncertainty.class_interval(b, t, settings["level"], settings["resamples"],
                                                          settings["seed"])
            better = group[(group["method"] == claim.better) & group["seed"].isin(seeds)].sort_values("seed")
            rows.append({"study": study, "claim": claim.says, "better": claim.better, "than": claim.than,
                         "dataset": dataset, "noise": noise, "noise_name": noise_names.get((dataset, noise), noise),
                         "metric": metric, "seeds": len(seeds), "differences": diffs, "mean": mean, "sd": sd,
                         "seed_low": seed_ci[0] if seed_ci else math.nan,
                         "seed_high": seed_ci[1] if seed_ci else math.nan,
                         "class_low": class_ci[0] if class_ci else math.nan,
                         "class_high": class_ci[1] if class_ci else math.nan,
                         "detectable": uncertainty.detectable(sd, len(diffs), settings["level"]),
                         "agree": sum(d > 0 for d in diffs), "verdict": uncertainty.verdict(seed_ci, class_ci),
                         "diagnostics": _diagnostics(better, getattr(claim, "diagnostics", ())),
                         "label": f"{label(claim.better)} vs {label(claim.than)}"})
    return pd.DataFrame(rows, columns=[*columns, "diagnostics", "label"])


def _interval(low: float, high: float) -> tuple[float, float] | None:
    return None if math.isnan(low) else (low, high)


def _diagnostics(runs: pd.DataFrame, wanted: Iterable[tuple[str, str]]) -> str:
    """The claimed run's decisions that explain the ordering, per seed: ``what: a%, b%, c%`` (shares in %, as every
    table gives them; seed order);
    a measure with no value in any seed (e.g. closed-set scores under open-set noise) is left out."""
    parts = []
    for column, what in wanted:
        if column not in runs or runs[column].isna().all():
            continue
        parts.append(f"{what}: " + ", ".join("–" if math.isnan(v) else f"{100 * v:.1f}%"
                                             for v in runs[column].astype(float)))
    return "; ".join(parts)


def section(table: pd.DataFrame, metric: str, settings: dict | None = None) -> list[str]:
    """The report's section: one line per claim and setting, then the grid's resolution."""
    head = metric_name(metric)
    if table.empty:
        return []
    level = round(100 * (settings or {"level": 0.95})["level"])
    one_seed = int(table["seeds"].max()) == 1
    md = ["## The papers' claimed orderings, with their uncertainty", "",
          f"Each paper claims its method above a baseline. Here: the per-seed difference in {head} points (claimed "
          "minus baseline; the same seed trains both on the same labels), its mean, and two "
          f"{level}% intervals of the difference: over seeds (paired t) and over test classes (a bootstrap that "
          "resamples whole classes, the same resample for both runs and every seed). "
          + (f"**{ONE_SEED}**: add seeds (`-S 'grid.seeds=[0,1,2]'`) for a verdict." if one_seed
             else f"Verdict: {RULE}."), "",
          "The last column is the claimed method's own decisions per seed, scored by the trainer against ground truth "
          "the method never sees: what the ordering hinges on, so a miss comes with its cause.", "",
          f"| paper | claim | rows | dataset | noise | per-seed difference ({head} points) | mean difference | {level}% interval, "
          f"seeds | {level}% interval, test classes | seeds where it holds | verdict | the claimed method's "
          "decisions, per seed |",
          "|:---|:---|:---|:---|:---|---:|---:|---:|---:|---:|:---|:---|"]
    for r in table.itertuples():
        diffs = ", ".join(f"{d:+.{DIGITS}f}" for d in r.differences)
        verdict_text = ONE_SEED if r.seeds == 1 else r.verdict
        md.append(f"| {r.study} | {r.claim} | {r.label} | {r.dataset} | {r.noise_name} | {diffs} | "
                  f"{r.mean:+.{DIGITS}f} | {uncertainty.interval_text(_interval(r.seed_low, r.seed_high), DIGITS)} | "
                  f"{uncertainty.interval_text(_interval(r.class_low, r.class_high), DIGITS)} | "
                  f"{r.agree} of {r.seeds} | {verdict_text} | {r.diagnostics or '–'} |")
    return md + [""] + resolution(table, head) + robustness(table)


def resolution(table: pd.DataFrame, head: str) -> list[str]:
    """The smallest differences this grid can decide: the median half-width of the intervals over seeds and over
    test classes."""
    seed_half = ((table["seed_high"] - table["seed_low"]) / 2).dropna()
    class_half = ((table["class_high"] - table["class_low"]) / 2).dropna()
    parts = []
    if not seed_half.empty:
        parts.append(f"over seeds, about {seed_half.median():.{DIGITS}f} {head} points with "
                     f"{int(table['seeds'].max())} seeds (median half-width of the intervals; it shrinks as "
                     "1/sqrt(seeds))")
    if not class_half.empty:
        parts.append(f"over test classes, about {class_half.median():.{DIGITS}f} points (this test set's size)")
    if not parts:
        return []
    return ["**The smallest difference this grid decides**: " + "; ".join(parts)
            + ". A smaller difference is undecided however its sign falls.", ""]


def robustness(table: pd.DataFrame) -> list[str]:
    """Per claim, where it holds, is undecided or reversed (dataset / noise settings): the robustness summary."""
    decided = table[table["seeds"] > 1]
    if decided.empty:
        return []
    md = ["Where each claim holds (settings with at least two seeds):", ""]
    for (study, claim), group in decided.groupby(["study", "claim"], sort=False):
        parts = []
        for outcome in (HOLDS, OPEN, REVERSED):
            where = [f"{r.dataset} {r.noise_name}" for r in group.itertuples() if r.verdict == outcome]
            if where:
                parts.append(f"{outcome} on {', '.join(where)}")
        md.append(f"- {study}, {claim}: " + "; ".join(parts) + ".")
    return md + [""]


def to_csv_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The table as ``reports/orderings.csv`` writes it: the differences joined by ``;``."""
    out = table.drop(columns=["label"]) if "label" in table else table.copy()
    out["differences"] = [";".join(f"{d:.4f}" for d in ds) for ds in out["differences"]]
    return out
