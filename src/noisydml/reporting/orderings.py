"""The orderings the papers claim (a study's :class:`~noisydml.studies.base.Claim`: its method above its baseline),
checked seed by seed: for every dataset and noise setting of the grid where both rows ran, the per-seed paired
difference (the same seed trains both on the same labels), their mean ± sample standard deviation, and in how many
seeds the claim holds. With one seed no ordering is claimed: the difference is shown, the verdict is not.
"""

from __future__ import annotations

import math
from typing import Iterable

import pandas as pd

from noisydml.reporting.names import DIGITS, metric_name

#: A claim's verdict, from the paired differences (the rule the section states).
HOLDS, REVERSED, OPEN = "holds", "reversed", "undecided"
RULE = ("holds: the claimed method is above in every seed and the mean difference exceeds the differences' sample "
        "standard deviation; reversed: the same the other way; otherwise undecided")
ONE_SEED = "one seed: no ordering is claimed"


def verdict(differences: list[float]) -> str:
    """:data:`HOLDS`, :data:`REVERSED` or :data:`OPEN` for per-seed differences (claimed minus baseline)."""
    if len(differences) < 2:
        return OPEN
    mean = sum(differences) / len(differences)
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1))
    if all(d > 0 for d in differences) and mean > sd:
        return HOLDS
    if all(d < 0 for d in differences) and -mean > sd:
        return REVERSED
    return OPEN


def paired(per_seed: pd.DataFrame, claims: Iterable, metric: str, noise_names: dict[tuple[str, str], str],
           label) -> pd.DataFrame:
    """One row per (claim, dataset, noise) where both runs have a seed in common: the per-seed differences in
    points of ``metric`` (%), their mean and sd, how many seeds agree, and the verdict. ``label``: run -> row label."""
    columns = ["study", "claim", "better", "than", "dataset", "noise", "noise_name", "metric", "seeds",
               "differences", "mean", "sd", "agree", "verdict"]
    if per_seed.empty or metric not in per_seed:
        return pd.DataFrame(columns=columns)
    values = per_seed.set_index(["dataset", "noise", "method", "seed"])[metric]
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
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) if len(diffs) > 1 else math.nan
            better = group[(group["method"] == claim.better) & group["seed"].isin(seeds)].sort_values("seed")
            rows.append({"study": study, "claim": claim.says, "better": claim.better, "than": claim.than,
                         "dataset": dataset, "noise": noise, "noise_name": noise_names.get((dataset, noise), noise),
                         "metric": metric, "seeds": len(seeds), "differences": diffs, "mean": mean, "sd": sd,
                         "agree": sum(d > 0 for d in diffs), "verdict": verdict(diffs),
                         "diagnostics": _diagnostics(better, getattr(claim, "diagnostics", ())),
                         "label": f"{label(claim.better)} vs {label(claim.than)}"})
    return pd.DataFrame(rows, columns=[*columns, "diagnostics", "label"])


def _diagnostics(runs: pd.DataFrame, wanted: Iterable[tuple[str, str]]) -> str:
    """The claimed run's decisions that explain the ordering, per seed: ``what: a, b, c`` (shares, seed order);
    a measure with no value in any seed (e.g. closed-set scores under open-set noise) is left out."""
    parts = []
    for column, what in wanted:
        if column not in runs or runs[column].isna().all():
            continue
        parts.append(f"{what}: " + ", ".join("–" if math.isnan(v) else f"{v:.2f}" for v in runs[column].astype(float)))
    return "; ".join(parts)


def section(table: pd.DataFrame, metric: str) -> list[str]:
    """The report's section: one line per claim and setting."""
    head = metric_name(metric)
    if table.empty:
        return []
    one_seed = int(table["seeds"].max()) == 1
    md = ["## The papers' claimed orderings, seed by seed", "",
          f"Each paper claims its method above a baseline. Here: the per-seed difference in {head} points (claimed "
          "minus baseline; the same seed trains both on the same labels), their mean ± sample standard deviation, "
          "and in how many seeds the claim holds. "
          + (f"**{ONE_SEED}**: add seeds (`-S 'grid.seeds=[0,1,2]'`) for a verdict." if one_seed
             else f"Verdict: {RULE}."), "",
          "The last column is the claimed method's own decisions per seed, scored by the trainer against ground truth "
          "the method never sees: what the ordering hinges on, so a miss comes with its cause.", "",
          f"| paper | claim | rows | dataset | noise | per-seed difference ({head} points) | mean ± sd | seeds "
          "where it holds | verdict | the claimed method's decisions, per seed |",
          "|:---|:---|:---|:---|:---|---:|---:|---:|:---|:---|"]
    for r in table.itertuples():
        diffs = ", ".join(f"{d:+.{DIGITS}f}" for d in r.differences)
        spread = f"{r.mean:+.{DIGITS}f}" + ("" if math.isnan(r.sd) else f" ± {r.sd:.{DIGITS}f}")
        verdict_text = ONE_SEED if r.seeds == 1 else r.verdict
        md.append(f"| {r.study} | {r.claim} | {r.label} | {r.dataset} | {r.noise_name} | {diffs} | {spread} | "
                  f"{r.agree} of {r.seeds} | {verdict_text} | {r.diagnostics or '–'} |")
    return md + [""] + robustness(table)


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
