"""The report's main tables: one per dataset, methods as rows (``report.labels``), one column per (noise setting,
metric of ``report.metrics``), headed as the papers name them (:mod:`noisydml.reporting.names`), cells = mean ±
sample standard deviation over seeds in %.

Honest about n: with one seed nothing is bold and the caption says that no ordering is claimed; with several, a
column's best mean is bold only where it leads every other row of the column by more than both rows' standard
deviations (:func:`leader`). Rows of ``report.reference_rows`` (runs whose embedding is not a method's product, such
as a phase that trains only a side module on a frozen backbone) sit beneath a rule, never bold, their footnote
saying what they are. Written as Markdown (``results.md``) and LaTeX (``results.tex``, one ``tabular`` per table,
needs ``booktabs``)."""

from __future__ import annotations

import math

import pandas as pd

from noisydml.sections.grid import noises_of
from noisydml.reporting.names import DASH, DASH_NOTE, DIGITS, METRICS, metric_name
from noisydml.runs import TUNED_SUFFIX

#: Column heads of the metrics, as papers print them.
SHORT = METRICS
#: What a one-seed table's caption says instead of marking a best row.
ONE_SEED = "one seed: no ordering is claimed"
#: The bold rule, as the captions state it.
BOLD_RULE = ("bold: a column's best mean where it exceeds every other row's mean by more than both rows' sample "
             "standard deviations")


def metric_head(metric: str) -> str:
    return metric_name(metric)


def row_names(params: dict) -> list[str]:
    """Rows of the main tables: the grid's methods, the chained runs' names, then the tuned runs' (methods, chains)."""
    tuning = params.get("tuning", {})
    tuned = [name + TUNED_SUFFIX for name in [*tuning.get("methods", []), *tuning.get("chains", [])]]
    return list(dict.fromkeys([*params["grid"]["methods"], *(c["name"] for c in params["chains"].values()), *tuned]))


def method_rows(params: dict) -> list[str]:
    """The rows compared as methods: :func:`row_names` less ``report.reference_rows``."""
    return [r for r in row_names(params) if r not in params["report"]["reference_rows"]]


def reference_rows(params: dict) -> list[str]:
    """The rows shown for reference beneath the methods (``report.reference_rows`` of the grid)."""
    return [r for r in row_names(params) if r in params["report"]["reference_rows"]]


def label(run: str, params: dict) -> str:
    """A run's row label (``report.labels``; its own name where none is given; a tuned run: its method's label
    and "(tuned)")."""
    labels = params["report"]["labels"]
    if run not in labels and run.endswith(TUNED_SUFFIX):
        method = run[: -len(TUNED_SUFFIX)]
        return f"{labels.get(method, method)} (tuned)"
    return labels.get(run, run)


Cell = tuple[float, float, int]  # mean %, sample sd % (nan for one seed), seeds


def _cells(summary: pd.DataFrame, dataset: str, params: dict) -> tuple[list[tuple[str, str]], dict[tuple, Cell]]:
    """Columns (noise, metric) and {(run, column): (mean %, sd % or nan, seeds)}."""
    columns = [(n, m) for n in noises_of(params["grid"]) for m in params["report"]["metrics"]]
    rows = summary[summary["dataset"] == dataset].set_index(["noise", "method"])
    values = {}
    for run in row_names(params):
        for noise, metric in columns:
            if (noise, run) not in rows.index:
                continue  # a chained run exists only where its entry in `chains` puts it
            row = rows.loc[(noise, run)]
            sd = row.get(f"{metric}_std", float("nan"))
            values[run, (noise, metric)] = (100 * float(row[metric]), 100 * float(sd) if pd.notna(sd) else math.nan,
                                            int(row["seeds"]))
    return columns, values


def leader(column: list[Cell]) -> int | None:
    """The index of the cell to bold in one column of method cells: the best mean, where it exceeds every other
    cell's mean by more than both cells' sample standard deviations; None with one seed (no sd), a tie, or a lead
    within the spread."""
    shown = [c for c in column if not math.isnan(c[0])]
    if len(shown) < 2:
        return None
    best = max(range(len(column)), key=lambda i: -math.inf if math.isnan(column[i][0]) else column[i][0])
    mean, sd, _ = column[best]
    for i, (other, other_sd, _) in enumerate(column):
        if i == best or math.isnan(other):
            continue
        if math.isnan(sd) or math.isnan(other_sd) or not mean - other > max(sd, other_sd):
            return None
    return best


def _bold(values: dict[tuple, Cell], runs: list[str], columns: list[tuple[str, str]]) -> set[tuple]:
    out = set()
    for column in columns:
        holders = [r for r in runs if (r, column) in values]
        best = leader([values[r, column] for r in holders])
        if best is not None:
            out.add((holders[best], column))
    return out


def seeds_of(values: dict[tuple, Cell]) -> list[int]:
    return sorted({v[2] for v in values.values()})


def caption(dataset: str, values: dict[tuple, Cell], params: dict) -> str:
    seeds = seeds_of(values) or [0]
    n = "n = " + "/".join(map(str, seeds)) + f" seed{'s' * (seeds != [1])}"
    if seeds == [1]:
        spread = ONE_SEED
    else:
        spread = "mean ± sample standard deviation (ddof=1)" + (
            "; rows of fewer seeds say how many" if len(seeds) > 1 else "") + f"; {BOLD_RULE}"
    return (f"{dataset}: retrieval on the test classes in %, {n} ({spread}); "
            f"{_selection_text(params['train'])}.")


def _selection_text(train: dict) -> str:
    if train["model_selection"] == "best_validation":
        return (f"model of the epoch with the best validation P@1 on {train['validation_classes']} held-out "
                "training classes; the test set never selects")
    return "final epoch, no test-set model selection"


def _text(value: Cell, is_bold: bool, bold: tuple[str, str], pm: str) -> str:
    mean, sd, _ = value
    text = f"{mean:.{DIGITS}f}" + ("" if math.isnan(sd) else f" {pm} {sd:.{DIGITS}f}")
    return f"{bold[0]}{text}{bold[1]}" if is_bold else text


def _row_label(run: str, values: dict[tuple, Cell], params: dict) -> str:
    """The row's label; where its seeds differ from the table's most, how many it has."""
    most = max(seeds_of(values) or [0])
    mine = {v[2] for (r, _), v in values.items() if r == run}
    fewer = f" (n = {min(mine)})" if mine and min(mine) != most else ""
    return label(run, params) + fewer


def _noise_head(dataset: str, noise: str, names: dict[tuple[str, str], str]) -> str:
    return names.get((dataset, noise), noise)


def _footnotes(values: dict[tuple, Cell], runs: list[str], columns, params: dict) -> list[str]:
    notes = []
    if any((r, c) not in values for r in runs for c in columns):
        notes.append(DASH_NOTE)
    notes += [f"{label(r, params)}: {params['report']['reference_rows'][r]}" for r in reference_rows(params)]
    return notes


def markdown(summary: pd.DataFrame, params: dict, noise_names: dict[tuple[str, str], str] | None = None) -> list[str]:
    """One Markdown table per dataset of the grid, with its caption and footnotes, then the labels' runs."""
    names, md = noise_names or {}, []
    methods, references = method_rows(params), reference_rows(params)
    for dataset in params["grid"]["datasets"]:
        columns, values = _cells(summary, dataset, params)
        bold = _bold(values, methods, columns)
        md += [f"**Table: {caption(dataset, values, params)}**", "",
               "| Method | " + " | ".join(f"{_noise_head(dataset, n, names)} {metric_head(m)}" for n, m in columns) + " |",
               "|:---|" + "---:|" * len(columns)]

        def line(run: str) -> str:
            cells = [_text(values[run, c], (run, c) in bold, ("**", "**"), "±") if (run, c) in values else DASH
                     for c in columns]
            return f"| {_row_label(run, values, params)} | " + " | ".join(cells) + " |"

        md += [line(r) for r in methods]
        if references:
            md += ["| *for reference, not a method:* |" + " |" * len(columns)] + [line(r) for r in references]
        md += [""] + [f"- {note}" for note in _footnotes(values, methods + references, columns, params)] + [""]
    named = [f"{label(r, params)} = `{r}`" for r in row_names(params) if label(r, params) != r]
    if named:
        md += ["Rows and our runs (params.yaml `grid.methods`, `chains`): " + "; ".join(named) + ".", ""]
    return md


#: LaTeX's special characters in text, and what writes each.
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def latex(summary: pd.DataFrame, params: dict, noise_names: dict[tuple[str, str], str] | None = None) -> str:
    """The main tables as LaTeX: one ``table`` environment with one ``tabular`` per dataset (``booktabs`` rules),
    the same cells, bold and footnotes as :func:`markdown`."""
    names = noise_names or {}
    methods, references = method_rows(params), reference_rows(params)
    out = ["% noisydml: the main tables (reports/results.tex, written by the report stage). Needs \\usepackage{booktabs};",
           "% a table wider than the text: \\begin{table*} in a two-column paper, or adjustbox's max width=\\linewidth.",
           ""]
    for dataset in params["grid"]["datasets"]:
        columns, values = _cells(summary, dataset, params)
        bold = _bold(values, methods, columns)
        noises = list(dict.fromkeys(n for n, _ in columns))
        per_noise = len(params["report"]["metrics"])
        out += ["\\begin{table}[t]", "\\centering", "\\small",
                f"\\caption{{{latex_escape(caption(dataset, values, params))}}}",
                f"\\label{{tab:noisydml-{latex_escape(dataset)}}}",
                "\\begin{tabular}{l" + "r" * len(columns) + "}", "\\toprule",
                " & ".join(["", *(f"\\multicolumn{{{per_noise}}}{{c}}{{{latex_escape(_noise_head(dataset, n, names))}}}"
                               for n in noises)]) + " \\\\"]
        if per_noise > 1:
            out.append(" ".join(f"\\cmidrule(lr){{{2 + i * per_noise}-{1 + (i + 1) * per_noise}}}"
                                for i in range(len(noises))))
        out += [" & ".join(["Method", *(latex_escape(metric_head(m)) for _, m in columns)]) + " \\\\", "\\midrule"]

        def line(run: str) -> str:
            cells = [_text(values[run, c], (run, c) in bold, ("\\textbf{", "}"), "$\\pm$")
                     if (run, c) in values else "--" for c in columns]
            return " & ".join([latex_escape(_row_label(run, values, params)), *cells]) + " \\\\"

        out += [line(r) for r in methods]
        if references:
            out += ["\\midrule", f"\\multicolumn{{{1 + len(columns)}}}{{l}}{{\\emph{{for reference, not a method:}}}} "
                    "\\\\"] + [line(r) for r in references]
        out += ["\\bottomrule", "\\end{tabular}"]
        notes = _footnotes(values, methods + references, columns, params)
        if notes:
            out += ["\\par\\smallskip\\footnotesize " + " \\\\ ".join(latex_escape(n).replace(DASH, "--")
                                                                      for n in notes)]
        out += ["\\end{table}", ""]
    return "\n".join(out)
