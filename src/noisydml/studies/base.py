"""The study interface: one paper's runs, checks and report sections, as a plug-in.

A study is a module ``noisydml/studies/<name>.py`` with a module-level ``STUDY = Study(...)``. It owns:

- **params sections** under ``figures`` (``sections``: key -> check), validated by the study, never by the config
  core, so editing a study's check re-runs only the stages of that study (its runs, the evaluate and report
  stages), not the grid;
- **its own runs** (``runs``: validated params -> :class:`~noisydml.runs.Run` values, e.g. ablation variants,
  per-cell retrainings, embedding-size points): trained by the train stage (``--run-folder <folder> --study <name>``),
  evaluated and reported like the grid's, never in the grid's tables;
- **the orderings its paper claims** (``claims``: :class:`Claim` values), checked seed by seed by the report;
- **report sections** (``report``: a :class:`ReportContext` -> Markdown lines; it may write its own CSVs and
  plots into ``ctx.out``, ``reports/studies/<name>/``, linked from the Markdown with ``ctx.link(file)``).

Studies never import the trainer; the config core never imports studies; the papers' numbers come from
``references/papers/*.csv`` (``ctx.references``). A study is discovered by its file name, like a method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from noisydml.runs import Run, RunKind


@dataclass(frozen=True)
class ReportContext:
    """What a study's report section sees."""

    params: dict[str, Any]  # validated params
    sections: dict[str, Any]  # the study's own ``figures`` sections, validated
    #: Grid and chained runs, one row per run and seed (metrics, the trainer's ``diag_*`` / ``final_diag_*``,
    #: ``histogram_*``, ``curve_*``): reports/results_per_seed.csv's rows of those runs.
    per_seed: pd.DataFrame
    #: The grid and chains' mean and sample SD over seeds, per (dataset, noise, method): reports/results.csv.
    summary: pd.DataFrame
    #: This study's own runs (its :func:`Study.runs`), one row per run and seed, and their Run values by name.
    own_runs: pd.DataFrame
    runs: dict[str, Run]
    #: The papers' numbers, one row per cell (references/papers/*.csv).
    references: pd.DataFrame
    #: The ``timing`` stage's results, one per entry of ``timing.entries`` (empty: no timing).
    timing: list[dict[str, Any]]
    #: The study's own folder, ``reports/studies/<name>/`` (a folder output of the report stage: a study writes
    #: whatever files it wants there without a line of dvc.yaml).
    out: Path
    #: The report's figures folder, ``reports/figures/`` (a DVC plots folder: PNG only; a study's figure is
    #: ``<study>-<name>.png``, its PDF in ``reports/pdf/``); a figure is drawn only where it has data.
    figures: Path = Path("reports/figures")
    #: (dataset, noise setting) -> the setting as a paper names it (``50% symmetric``), for tables and titles.
    noise_names: dict[tuple[str, str], str] = field(default_factory=dict)

    def link(self, name: str) -> str:
        """``name`` (a file of :attr:`out`) as results.md links it."""
        return f"studies/{self.out.name}/{name}"

    def figure(self, name: str) -> Path:
        """Where the study's figure ``name`` (``<name>.png``) is written."""
        return self.figures / f"{self.out.name}-{name}.png"

    def embed(self, name: str, alt: str) -> str:
        """results.md's image line for the study's figure ``name``."""
        return f"![{alt}]({self.figures.name}/{self.figure(name).name})"

    def markdown(self, table: pd.DataFrame, shares: tuple[str, ...] | list[str] = (), dash: str = "") -> str:
        """``table`` as results.md prints it: settings and runs named (:meth:`named`), the ``shares`` columns (values
        in [0, 1]) in % with two decimals, other floats as they are, a dash where there is no value (``dash``: why,
        a footnote line under the table)."""
        from noisydml.reporting.names import DASH, DIGITS, percent

        out = self.named(table)
        for column in out.columns:
            if column in shares:
                out[column] = [percent(v, DIGITS) for v in table[column]]
            elif pd.api.types.is_float_dtype(table[column]):
                out[column] = [DASH if pd.isna(v) else f"{v:g}" for v in table[column]]
        out = out.rename(columns={c: f"{c} %" for c in shares if c in out.columns})
        text = out.to_markdown(index=False, disable_numparse=True)
        return text + (f"\n\n{DASH}: {dash}" if dash and (out == DASH).any().any() else "")

    def named(self, table: pd.DataFrame) -> pd.DataFrame:
        """``table`` with noise ids (``noise`` column, beside ``dataset``) and run names (``method``) as a reader
        names them; the CSVs keep the ids."""
        from noisydml.reporting.names import named_table

        return named_table(table, self.params["report"]["labels"], self.noise_names)


@dataclass(frozen=True)
class Claim:
    """An ordering a paper claims: run ``better`` above run ``than`` (grid or chained run names), in the paper's
    words (``says``). The report checks it seed by seed wherever the grid ran both (:mod:`noisydml.reporting.orderings`)."""

    better: str
    than: str
    says: str
    #: The claimed run's decisions that explain an ordering (``(results column, what it measures)``, scored by the
    #: trainer from ground truth the method never sees): shown beside every setting, so a miss comes with its cause.
    diagnostics: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Study:
    """A paper's runs, checks and report sections (see the module docstring)."""

    name: str
    title: str  # the paper, as its report section is headed
    #: ``figures.<key>`` sections this study owns -> ``check(section, params) -> validated section`` (raising
    #: :class:`~noisydml.schema.ParamsError` with the key, the value and what is allowed).
    sections: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = field(default_factory=dict)
    #: The kinds of its own runs (each names the dvc.yaml template that trains it); every run it returns is of one.
    kinds: tuple[RunKind, ...] = ()
    #: The study's own runs: ``runs(params, sections)`` with its ``figures`` sections validated.
    runs: Callable[[dict[str, Any], dict[str, Any]], list[Run]] = lambda params, sections: []
    #: Its report sections (Markdown lines); may write files into ``ctx.out``.
    report: Callable[[ReportContext], list[str]] = lambda ctx: []
    #: The orderings the paper claims, checked seed by seed in the report's "claimed orderings" section.
    claims: tuple[Claim, ...] = ()


def check_run_target(entry: dict, params: dict[str, Any], where: str) -> None:
    """A study's own runs train on a dataset and noise of the grid (whose labels the corrupt stage makes)."""
    from noisydml.sections.grid import noises_of
    from noisydml.schema import ParamsError, check_choice

    grid = params["grid"]
    check_choice(entry["dataset"], grid["datasets"], f"{where}.dataset", "dataset of grid.datasets")
    if entry["noise"] not in noises_of(grid):
        raise ParamsError(f"{where}.noise: {entry['noise']!r} is not a noise setting the grid trains on (its labels "
                          f"are made for those only); allowed: {', '.join(noises_of(grid))}; e.g. -S "
                          f"'grid.noises=[{', '.join([*grid['noises'], entry['noise']])}]'")


def percent(row, metric: str) -> str:
    """``metric`` of a summary row in %, with ± its sample SD when there is more than one seed."""
    text = f"{100 * row[metric]:.2f}"
    if row["seeds"] > 1 and pd.notna(row.get(metric + "_std")):
        text += f" ± {100 * row[metric + '_std']:.2f}"
    return text


def chain_run_value(runs: pd.DataFrame, chain: dict, name: str, column: str):
    """``column`` of run ``name`` at a chained run's dataset, noise and seed (``chain``: a chained Run's ``chain``,
    one seed; ``runs`` indexed by dataset, noise, method, seed); None when that run or column is absent."""
    index = (chain["dataset"], chain["noise"], name, chain["seed"])
    return runs.loc[index, column] if index in runs.index and column in runs.columns else None
