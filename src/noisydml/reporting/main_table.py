"""The report's main tables: one per dataset, methods as rows (``report.labels``), one column per (noise setting,
metric of ``report.metrics``), cells = mean ± sample standard deviation over seeds in %, the best mean of every
column in bold. Written as Markdown (``results.md``) and LaTeX (``results.tex``, one ``tabular`` per table, needs
``booktabs``)."""

from __future__ import annotations

import math

import pandas as pd

from noisydml.config import noises_of
from noisydml.runs import TUNED_SUFFIX

#: Column heads of the metrics, as papers print them.
SHORT = {"precision_at_1": "P@1", "mean_average_precision_at_r": "MAP@R", "r_precision": "RP", "nmi": "NMI"}
#: Digits after the point in the cells (percent).
DIGITS = 1


def metric_head(metric: str) -> str:
    return SHORT.get(metric, metric.replace("recall_at_", "R@"))


def row_names(params: dict) -> list[str]:
    """Rows of the main tables: the grid's methods, the chained runs' names, then the tuned runs' (methods, chains)."""
    tuning = params.get("tuning", {})
    tuned = [name + TUNED_SUFFIX for name in [*tuning.get("methods", []), *tuning.get("chains", [])]]
    return list(dict.fromkeys([*params["grid"]["methods"], *(c["name"] for c in params["chains"].values()), *tuned]))


def label(run: str, params: dict) -> str:
    """A run's row label (``report.labels``; its own name where none is given; a tuned run: its method's label
    and "(tuned)")."""
    labels = params["report"]["labels"]
    if run not in labels and run.endswith(TUNED_SUFFIX):
        method = run[: -len(TUNED_SUFFIX)]
        return f"{labels.get(method, method)} (tuned)"
    return labels.get(run, run)


def _cells(summary: pd.DataFrame, dataset: str, params: dict) -> tuple[list[tuple[str, str]], dict, dict, int]:
    """Columns (noise, metric), {(run, column): (mean %, sd % or nan)}, {column: best mean as shown}, seeds."""
    columns = [(n, m) for n in noises_of(params["grid"]) for m in params["report"]["metrics"]]
    rows = summary[summary["dataset"] == dataset].set_index(["noise", "method"])
    values, seeds = {}, 0
    for run in row_names(params):
        for noise, metric in columns:
            if (noise, run) not in rows.index:
                continue  # a chained run exists only where its entry in `chains` puts it
            row = rows.loc[(noise, run)]
            seeds = max(seeds, int(row["seeds"]))
            sd = row.get(f"{metric}_std", float("nan"))
            values[run, (noise, metric)] = (100 * float(row[metric]), 100 * float(sd) if pd.notna(sd) else math.nan)
    best = {}
    for column in columns:
        shown = [round(v[0], DIGITS) for (_, c), v in values.items() if c == column and not math.isnan(v[0])]
        if shown:
            best[column] = max(shown)
    return columns, values, best, seeds


def _caption(dataset: str, seeds: int, params: dict) -> str:
    spread = "± sample standard deviation (ddof=1)" if seeds > 1 else "one seed, so no standard deviation"
    return (f"{dataset}: retrieval on the test classes in %, mean over n = {seeds} seed{'s' * (seeds != 1)} "
            f"({spread}); best mean of each column in bold; {_selection_text(params['train'])}.")


def _selection_text(train: dict) -> str:
    if train["model_selection"] == "best_validation":
        return (f"model of the epoch with the best validation P@1 on {train['validation_classes']} held-out "
                "training classes; the test set never selects")
    return "final epoch, no test-set model selection"


def _text(value: tuple[float, float], is_best: bool, bold: tuple[str, str], pm: str) -> str:
    mean, sd = value
    text = f"{mean:.{DIGITS}f}" + ("" if math.isnan(sd) else f" {pm} {sd:.{DIGITS}f}")
    return f"{bold[0]}{text}{bold[1]}" if is_best else text


def markdown(summary: pd.DataFrame, params: dict) -> list[str]:
    """One Markdown table per dataset of the grid, with its caption, then the labels' runs."""
    md = []
    for dataset in params["grid"]["datasets"]:
        columns, values, best, seeds = _cells(summary, dataset, params)
        md += [f"**Table: {_caption(dataset, seeds, params)}**", "",
               "| Method | " + " | ".join(f"{n} {metric_head(m)}" for n, m in columns) + " |",
               "|:---|" + "---:|" * len(columns)]
        for run in row_names(params):
            cells = [_text(values[run, c], round(values[run, c][0], DIGITS) == best.get(c), ("**", "**"), "±")
                     if (run, c) in values else "–" for c in columns]
            md.append(f"| {label(run, params)} | " + " | ".join(cells) + " |")
        md.append("")
    named = [f"{label(r, params)} = `{r}`" for r in row_names(params) if label(r, params) != r]
    if named:
        md += ["Rows and our runs (params.yaml `grid.methods`, `chains`): " + "; ".join(named) + ".", ""]
    return md


#: LaTeX's special characters in text, and what writes each.
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def latex(summary: pd.DataFrame, params: dict) -> str:
    """The main tables as LaTeX: one ``table`` environment with one ``tabular`` per dataset (``booktabs`` rules)."""
    out = ["% noisydml: the main tables (reports/results.tex, written by the report stage). Needs \\usepackage{booktabs};",
           "% a table wider than the text: \\begin{table*} in a two-column paper, or adjustbox's max width=\\linewidth.",
           ""]
    for dataset in params["grid"]["datasets"]:
        columns, values, best, seeds = _cells(summary, dataset, params)
        noises = list(dict.fromkeys(n for n, _ in columns))
        per_noise = len(params["report"]["metrics"])
        out += ["\\begin{table}[t]", "\\centering", "\\small",
                f"\\caption{{{latex_escape(_caption(dataset, seeds, params))}}}",
                f"\\label{{tab:noisydml-{latex_escape(dataset)}}}",
                "\\begin{tabular}{l" + "r" * len(columns) + "}", "\\toprule",
                " & ".join(["", *(f"\\multicolumn{{{per_noise}}}{{c}}{{{latex_escape(n)}}}" for n in noises)])
                + " \\\\"]
        if per_noise > 1:
            out.append(" ".join(f"\\cmidrule(lr){{{2 + i * per_noise}-{1 + (i + 1) * per_noise}}}"
                                for i in range(len(noises))))
        out += [" & ".join(["Method", *(latex_escape(metric_head(m)) for _, m in columns)]) + " \\\\", "\\midrule"]
        for run in row_names(params):
            cells = [_text(values[run, c], round(values[run, c][0], DIGITS) == best.get(c), ("\\textbf{", "}"), "$\\pm$")
                     if (run, c) in values else "--" for c in columns]
            out.append(" & ".join([latex_escape(label(run, params)), *cells]) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return "\n".join(out)
