"""The papers' own numbers beside ours: every table of every paper in its layout, and a status table.

The numbers are data, not code: ``references/papers/<paper>.csv`` (one row per cell, written by
``scripts/transcribe_reference_tables.py`` from the transcriptions in the papers folder; see its docstring for
the columns). A paper cell meets one of our results when the row's ``method`` ran on a dataset of the cell's
kind (``datasets.<name>.kind``: cub200, cars196, sop, ...) under the cell's noise model and rate, trained under the
settings of the paper whose number the cell holds (the cell's ``settings_of``, the run's ``report.settings_of``):
a paper's reprint of another paper's number is filled by runs under the other paper's settings, and a run under
other settings shows in a row of its own beneath, labelled, never differenced. Our datasets
that are no paper's (the embedded glyphs, a folder) get columns of their own, headed as such: their numbers
show orderings, never a difference from the paper's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from noisydml.reporting.main_table import metric_head
from noisydml.reporting.tables import BEST_ON_TEST

#: Our dataset kinds whose labels are the dataset's own noise (a paper's "real" setting, not "clean").
REAL_NOISE_KINDS = {"cars98n", "food101n", "clothing1m"}
#: Paper datasets, short names as the papers print them.
SHORT = {"cars196": "CARS", "sop": "SOP", "cub200": "CUB", "cars98n": "CARS-98N", "food101n": "Food-101N",
         "clothing1m": "Clothing1M", "inshop": "In-shop", "faces": "MS1M"}
#: Metrics our runs report (the rest: training seconds, GPU hours, shown as the paper's only).
RETRIEVAL = ("precision_at_1", "mean_average_precision_at_r", "nmi", "recall_at_")
#: Face verification metrics (already in %): the pair sets' accuracies and the IJB set's TAR@FAR, the latter named
#: by the set a dataset reads (``ijb_name``: ijbb / ijbc), as the papers' columns are.
VERIFICATION = ("lfw_accuracy", "cfp_fp_accuracy", "agedb_30_accuracy", "ijbb_tar_at_far_", "ijbc_tar_at_far_")
#: A table's headline cells, the ones the status counts: P@1 (R@1 where a paper reports it), IJB-C TAR@FAR 1e-5.
HEADLINE = ("precision_at_1", "recall_at_1", "ijbc_tar_at_far_1e-05")
#: Face recognition's training sets, by the noise model of their labels (the cleaned twin is clean).
FACE_TRAIN_SETS = {"real": "MS1MV0", "clean": "MS1MV2"}


def settings_name(settings_of: str) -> str:
    """A run's ``report.settings_of`` as the report names it (a paper's tag is its name in lower case)."""
    return "our default" if settings_of == "none" else f"{settings_of.upper()}'s"

#: Within how many points a headline cell counts as reproduced.
REPRODUCED_WITHIN = 2.0
HEADLINE_COLUMN = "headline cells (rows we implement: P@1, R@1, IJB-C TAR@1e-5)"


def load_references(folder: str | Path) -> pd.DataFrame:
    frames = [pd.read_csv(path, keep_default_na=False, na_values={"value": [""], "std": [""], "rate": [""]})
              for path in sorted(Path(folder).glob("*.csv"))]
    if not frames:
        raise FileNotFoundError(f"{folder}: no reference tables (*.csv)")
    return pd.concat(frames, ignore_index=True)


def noise_model(stats: dict, dataset: dict) -> str:
    """A noise setting's model in the papers' terms, from its stats.json and the dataset's entry (a face set's
    ``variant``: its own labels are noisy, MS1MV0's kind, or cleaned)."""
    kind = stats["kind"]
    if kind == "published_list":
        return stats["settings"]["noise_model"]
    if kind == "none":
        if dataset["kind"] == "faces":
            return "real" if dataset["variant"] == "noisy" else "clean"
        return "real" if dataset["kind"] in REAL_NOISE_KINDS else "clean"
    return kind


def _paper_kind(dataset: dict) -> str:
    """A dataset's kind as the paper cells name datasets; synthetic faces are no paper's data."""
    if dataset["kind"] == "faces" and dataset.get("source") == "synthetic":
        return "faces (synthetic)"
    return dataset["kind"]


def our_cells(summary: pd.DataFrame, params: dict, stats: dict) -> pd.DataFrame:
    """Our summary rows keyed like the paper cells: ``method, kind, our_dataset, noise_model, rate``, and the
    settings they were trained under (``settings_of``, one tag for the experiment)."""
    if summary.empty:
        return pd.DataFrame(columns=["method", "kind", "our_dataset", "noise_model", "rate", "settings_of"])
    datasets = params["datasets"]
    rows = summary.copy()
    rows["settings_of"] = params["report"]["settings_of"]
    rows["kind"] = [_paper_kind(datasets[d]) for d in rows["dataset"]]
    rows["our_dataset"] = rows["dataset"]
    rows["noise_model"] = [noise_model(stats[d, n], datasets[d]) for d, n in zip(rows["dataset"], rows["noise"])]
    rows["rate"] = rows["noise_rate"].round(4)
    # the IJB set's TAR@FAR under the set's name (a face dataset reads one: ijb_name)
    for column in [c for c in rows.columns if c.startswith("tar_at_far_") and not c.endswith(("_std", "accepts"))]:
        for ijb in ("ijbb", "ijbc"):
            reads = [datasets[d].get("ijb_name", "ijbc") == ijb for d in rows["dataset"]]
            rows[f"{ijb}_{column}"] = rows[column].where(reads)
    return rows


def _is_ours(metric: str) -> bool:
    """A metric our runs report: retrieval, or face verification."""
    return metric.startswith(RETRIEVAL + VERIFICATION)


def _percent(metric: str) -> float:
    """The factor that puts our value of ``metric`` in % (verification metrics already are)."""
    return 1.0 if metric.startswith(VERIFICATION) else 100.0


def _column_label(cell) -> str:
    metric = metric_head(cell.metric)
    setting = f"{100 * cell.rate:g}%" if cell.noise not in ("clean", "real", "") else ""
    name = FACE_TRAIN_SETS[cell.noise] if cell.dataset == "faces" else SHORT.get(cell.dataset, cell.dataset)
    return " ".join(x for x in (name, setting, metric) if x)


def _ours(ours: pd.DataFrame, method: str, noise: str, rate: float, metric: str, kind: str | None = None,
          dataset: str | None = None, settings_of: str | None = None):
    """Our number for a cell (in %), from runs under ``settings_of``'s settings where given; None if none ran."""
    if not method or ours.empty or metric not in ours.columns:
        return None
    hit = ours[(ours["method"] == method) & (ours["noise_model"] == noise) & ((ours["rate"] - rate).abs() < 1e-6)]
    hit = hit[hit["kind"] == kind] if kind is not None else hit[hit["our_dataset"] == dataset]
    if settings_of is not None:
        hit = hit[hit["settings_of"] == settings_of]
    return None if hit.empty or pd.isna(hit[metric].iloc[0]) else _percent(metric) * float(hit[metric].iloc[0])


def _other_settings(ours: pd.DataFrame, group: pd.DataFrame, columns: pd.DataFrame) -> dict[str, list[str]]:
    """A paper row's runs under settings other than its cells' paper's: settings -> one value per column ("" where
    none ran), for a row of their own beneath the paper's."""
    method, out = group["method"].iloc[0], {}
    if not method or ours.empty:
        return out
    for settings in dict.fromkeys(ours["settings_of"]):
        values = []
        for col in columns.itertuples():
            hit = group[(group["dataset"] == col.dataset) & (group["noise"] == col.noise)
                        & ((group["rate"] - col.rate).abs() < 1e-6) & (group["metric"] == col.metric)]
            mine = None if hit.empty or hit["settings_of"].iloc[0] == settings else _ours(
                ours, method, col.noise, col.rate, col.metric, kind=col.dataset, settings_of=settings)
            values.append("" if mine is None else f"ours {mine:.2f}")
        if any(values):
            out[settings] = values
    return out


def side_by_side(cells: pd.DataFrame, ours: pd.DataFrame, paper_kinds: set[str]) -> tuple[list[str], int]:
    """One paper table in its layout: the paper's number, ours and the difference in every cell both have,
    then one column per setting our non-paper datasets cover (our numbers alone); and how many cells hold a
    number of ours."""
    cells = cells[cells["metric"].map(_is_ours)]
    if cells.empty:
        return [], 0
    columns = cells.drop_duplicates(["dataset", "noise", "rate", "metric"])
    extra = []  # (our dataset, noise, rate, metric) our non-paper datasets cover
    if not ours.empty:
        others = ours[~ours["kind"].isin(paper_kinds)]
        for col in columns.drop_duplicates(["noise", "rate", "metric"]).itertuples():
            for dataset in dict.fromkeys(others["our_dataset"]):
                if any(_ours(others, m, col.noise, col.rate, col.metric, dataset=dataset) is not None
                       for m in cells["method"].unique()):
                    extra.append((dataset, col.noise, col.rate, col.metric))
    header = [_column_label(c) for c in columns.itertuples()]
    header += [f"ours: {d} ({'' if n in ('clean', 'real') else f'{100 * r:g}% '}{metric_head(m)}; "
               "not a paper dataset)" for d, n, r, m in extra]
    out = ["| row | " + " | ".join(header) + " |", "|" + "---|" * (len(header) + 1)]
    notes, ran = {}, 0
    for row, group in cells.groupby("row", sort=False):
        method = group["method"].iloc[0]
        values = []
        for col in columns.itertuples():
            hit = group[(group["dataset"] == col.dataset) & (group["noise"] == col.noise)
                        & ((group["rate"] - col.rate).abs() < 1e-6) & (group["metric"] == col.metric)]
            if hit.empty:
                values.append("")
                continue
            paper = hit["value"].iloc[0]
            text = f"{paper:.2f}" + (f" ± {hit['std'].iloc[0]:.2f}" if pd.notna(hit["std"].iloc[0]) else "")
            settings = hit["settings_of"].iloc[0]
            mine = _ours(ours, method, col.noise, col.rate, col.metric, kind=col.dataset, settings_of=settings)
            if mine is not None:
                ran += 1
                text += f" · ours {mine:.2f} ({mine - paper:+.2f})"
                best = (_ours(ours, method, col.noise, col.rate, BEST_ON_TEST, kind=col.dataset, settings_of=settings)
                        if col.metric == "precision_at_1" else None)
                if best is not None and not math.isnan(best):
                    text += f" [best on test {best:.2f}]"
            values.append(text)
        for d, n, r, m in extra:
            mine = _ours(ours, method, n, r, m, dataset=d)
            ran += mine is not None
            values.append("" if mine is None else f"{mine:.2f}")
        note = group["note"].iloc[0]
        mark = ""
        if group["footnote"].iloc[0] == "yes":  # the reference table's own flag (its note is the footnote)
            notes[row] = note
            mark = " ‡"
        name = f"{row}{mark} (`{method}`)" if method else f"{row}{mark} (not implemented here)"
        out.append(f"| {name} | " + " | ".join(values) + " |")
        for settings, others in _other_settings(ours, group, columns).items():
            out.append(f"| ↳ {row}: ours under {settings_name(settings)} settings, not this paper's "
                       f"(`{method}`) | " + " | ".join(others) + " |" + " |" * len(extra))
    out.append("")
    out += [f"‡ {row}: {note}." for row, note in notes.items()]
    return out + ([""] if notes else []), ran


def status_table(references: pd.DataFrame, ours: pd.DataFrame) -> pd.DataFrame:
    """Per paper table: of the headline cells (:data:`HEADLINE`) whose row we implement, how many ran on the paper's
    dataset and how many of those are within :data:`REPRODUCED_WITHIN` points."""
    rows = []
    for (paper, table), cells in references.groupby(["paper", "table"], sort=False):
        first = cells[cells["metric"].isin(HEADLINE) & (cells["method"] != "")
                      & (cells["comparable"] == "yes")]
        if first.empty:
            rows.append({"paper": paper, "table": table, HEADLINE_COLUMN: 0, "run on the paper's data": 0,
                         f"within {REPRODUCED_WITHIN:g} points": 0,
                         "status": "not comparable (" + cells["note"].iloc[0] + ")" if cells["note"].iloc[0]
                         else "no row we implement"})
            continue
        diffs = [(_ours(ours, c.method, c.noise, c.rate, c.metric, kind=c.dataset, settings_of=c.settings_of), c.value)
                 for c in first.itertuples()]
        ran = [(mine, paper) for mine, paper in diffs if mine is not None]
        within = sum(abs(mine - paper) <= REPRODUCED_WITHIN for mine, paper in ran)
        if not ran:
            status = "not run"
        elif within == len(first):
            status = f"reproduced within {REPRODUCED_WITHIN:g} points"
        else:
            status = "not yet"
        rows.append({"paper": paper, "table": table, HEADLINE_COLUMN: len(first),
                     "run on the paper's data": len(ran), f"within {REPRODUCED_WITHIN:g} points": within,
                     "status": status})
    return pd.DataFrame(rows)


def reference_section(references: pd.DataFrame, summary: pd.DataFrame, params: dict, stats: dict) -> tuple[list[str], pd.DataFrame]:
    """The report's section: the status table, then every paper table side by side."""
    ours = our_cells(summary, params, stats)
    paper_kinds = set(SHORT)
    status = status_table(references, ours)
    md = ["## The papers' tables beside ours", "",
          f"Every table of {', '.join(dict.fromkeys(references['paper']))}, transcribed in "
          "`references/papers/*.csv`. A cell reads `paper · ours (ours - paper)` where we ran the row's method on "
          "the paper's dataset, noise and rate (e.g. via a published-list noise setting) under the settings of the "
          "paper whose number the cell holds (a cell reprinting another paper's number: that paper's settings; "
          f"these runs: {settings_name(params['report']['settings_of'])} settings, `report.settings_of`); a run of "
          "the row's method under other settings shows in a row of its own (↳), never differenced; our numbers on "
          "datasets no paper uses (the embedded glyphs) sit in their own columns and are never differenced. "
          "Status: a table is reproduced when every headline cell (P@1, R@1, IJB-C TAR@1e-5) of a row we implement "
          f"is within {REPRODUCED_WITHIN:g} points. `[best on test x]` beside our P@1 is **test-selected**: the highest test "
          "P@1 over the monitored epochs (every `train.eval_every` epochs and the last) and, where set, over the "
          "checks every `train.test_check_every_steps` steps (a paper profile sets the authors' interval), the "
          "figure a trainer that keeps its best test model reports, as some authors' code does (README \"Protocol\"). It shows how "
          "much of a difference model selection explains; our number (the last epoch) is the result.", "",
          status.to_markdown(index=False), ""]
    idle = []
    for (paper, table), cells in references.groupby(["paper", "table"], sort=False):
        lines, ran = side_by_side(cells, ours, paper_kinds)
        caption = cells["caption"].iloc[0]
        if ran or any(line.startswith("| ↳") for line in lines):  # a cell of ours, or a run under other settings
            md += [f"### {paper} {table}: {caption}", "", *lines]
            continue
        why = (cells["note"].iloc[0] if not lines else "none of its cells ran with these params") or "no retrieval metric"
        idle.append(f"- {paper} {table} ({caption}): {why}; its numbers: references/papers/{paper.lower()}.csv")
    if idle:
        md += ["### The papers' tables with nothing of ours", "", *idle, ""]
    return md, status
