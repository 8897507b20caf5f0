"""The report stage: tables (Markdown + CSV), noise statistics, plots, combined metrics -> ``reports/``, and
``reports/host.json``, the fingerprint of the host and numerics the report was made with (CI compares it with
its own host to know whether it must reproduce the committed metrics bit for bit).

The generic sections (the grid's results, noise, selection, weights, the papers' tables beside ours, training
time) come from :mod:`noisydml.reporting`; every study (:mod:`noisydml.studies`) then adds its own sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from noisydml import io
from noisydml.evaluation import metric_names
from noisydml.numerics import host_fingerprint
from noisydml.pipeline.layout import HOST_RECORD, Layout
from noisydml.reporting import budget, main_table, orderings
from noisydml.reporting.figures import noise_points, plot_metric_vs_noise, plot_selection, run_styles
from noisydml.reporting.names import noise_name
from noisydml.reporting.plots import FIGURES, plot_noise_per_class, plot_weight_histograms
from noisydml.reporting.references import REAL_NOISE_KINDS, load_references, reference_section
from noisydml.reporting.tables import (
    BEST_ON_TEST, SELECTION_COLUMNS, _chain_line, cluster_size_table, collect, noise_markdown, noise_stats,
    VERIFICATION_METRICS, noise_table, plot_series, selection_summary, shares_markdown, summarise, timing_results,
    timing_table, verification_markdown, weight_summary,
)
from noisydml.sections.grid import noises_of
from noisydml.runs import TUNED_SUFFIX, chain_tunings_of, find_chain, runs_of, tunings_of
from noisydml.studies import check_study, load_study, study_names
from noisydml.studies.base import ReportContext

#: What a rehearsal's report says first (``report.rehearsal``; :mod:`noisydml.tools.rehearsal`).
REHEARSAL_NOTE = ("miniature stand-ins of the datasets (their real file formats, a few dozen images) and randomly "
                  "initialised backbones (the published weights' key layout), one epoch: these numbers mean "
                  "nothing. It shows that the profile launches and that every stage and table cell runs.")
#: Every metric of every run (mean over seeds), what CI compares with the committed one
#: (:mod:`noisydml.tools.guard`).
ALL_METRICS = "all_metrics.json"
#: DVC's metrics: one small file per run of the grid (``<dataset>/<noise>/<run>.json``), the few numbers a person
#: compares, so that ``dvc metrics show`` / ``diff`` and ``dvc exp show`` fit a terminal.
HEADLINE = "metrics"
#: Run kinds of the grid's tables; every other kind is a study's own run, reported in its section.
GRID_KINDS = ("grid", "chain", "tuned")


def report(params: dict, layout: Layout = Layout()) -> Path:
    out = write_report(params, layout)
    io.write_json(layout.reports / HOST_RECORD, host_fingerprint(params["runtime"], environment=True))
    return out


def write_headline(summary: pd.DataFrame, params: dict, folder: Path) -> None:
    """``folder/<dataset>/<noise>/<run>.json``: the metrics of ``report.metrics`` in %, mean over seeds (2 digits),
    of every run of the grid's tables; files of runs no longer in the grid are removed."""
    wanted = {}
    for r in summary.itertuples():
        wanted[Path(r.dataset) / r.noise / f"{r.method}.json"] = {
            main_table.metric_head(m): round(100 * float(getattr(r, m)), 2) for m in params["report"]["metrics"]}
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        if path.relative_to(folder) not in wanted:
            path.unlink()
    for relative, values in wanted.items():
        io.write_json(folder / relative, values)


def tuning_lines(params: dict, layout: Layout) -> list[str]:
    """The tuned runs' values and how they were chosen (their tune stage's chosen.json, as the tuned run recorded
    and the evaluate stage kept it): one row per study, each key as untuned -> chosen."""
    studies = [(d, n, m, None) for d, n, m in tunings_of(params)]
    studies += [(d, n, name, find_chain(params["chains"], d, n, name, "tuning.chains")[1])
                for d, n, name in chain_tunings_of(params)]
    if not studies:
        return []
    rows, records = [], []
    for dataset, noise, name, chain in studies:
        # every seed of a tuned run trains with the same values
        seed = chain["seeds"][0] if chain else params["grid"]["seeds"][0]
        method = chain["method"] if chain else name
        tuned = io.read_json(layout.metrics(dataset, noise, name + TUNED_SUFFIX, seed))["tuned"]
        records.append(tuned)
        # the untuned run's values, as the tuned run recorded them beside the chosen ones
        values = ", ".join(f"{key}: {tuned['untuned'][key]!r} -> {value!r}" for key, value in tuned["values"].items())
        first = "; ".join(f"{100 * t['val_precision_at_1']:.2f}" for t in tuned["first_trials"])
        rows.append({"dataset": dataset, "noise": noise, "tuned": name if not chain else f"{name} ({method})",
                     "untuned -> chosen": values, "chosen trial": f"{tuned['trial'] + 1} of {tuned['trials']}",
                     "val P@1 chosen": f"{100 * tuned['val_precision_at_1']:.2f}",
                     "val P@1 first trials (paper; untuned)": first})
    budget = records[0]  # one tuning section made every study: the same budget, sampler, seed and split
    return ["## Tuning", "",
            f"The `(tuned)` rows: each method with the values its tuning study chose, the same budget for every "
            f"method ({budget['trials']} trials, Optuna's {budget['sampler']['name']} sampler, seed {budget['seed']}), "
            f"scored by the P@1 of {budget['validation_classes']} training classes held out by noisy label (never the "
            "test split); the first trial is the paper's values, the second the untuned run's. Then trained on the "
            "full training set at every seed. A tuned chained run's study trains the chain's upstream runs once, "
            "untuned, on the same split and tunes the chain's own step (its method's space); the tuned run then "
            "trains from the grid's upstream.", "", pd.DataFrame(rows).to_markdown(index=False), ""]


def _setting(column: str, noise_names: dict[tuple[str, str], str]) -> str:
    """``glyphs / sc50`` (a table's column of ids) -> ``glyphs, 50% small-cluster``."""
    dataset, noise = column.split(" / ")
    return f"{dataset}, {noise_names.get((dataset, noise), noise)}"


@dataclass
class ReportData:
    """What the report's sections, tables and figures are made of: every run's row, the grid's per seed and their
    summary, the noise statistics and tables, the studies and their own runs, the papers' numbers, the claims'
    orderings."""

    params: dict
    layout: Layout
    stats: dict
    studies: dict
    sections: dict
    own: dict
    every_run: pd.DataFrame
    per_seed: pd.DataFrame
    study_rows: pd.DataFrame
    names: list[str]
    summary: pd.DataFrame
    noise: pd.DataFrame
    selection: pd.DataFrame
    weights: pd.DataFrame
    timing: object
    times: pd.DataFrame
    clusters: pd.DataFrame | None
    references: object
    noise_names: dict
    ordering: object

    @property
    def out(self) -> Path:
        return self.layout.reports

    @property
    def figures(self) -> Path:
        return self.layout.reports / FIGURES


def gather(params: dict, layout: Layout) -> ReportData:
    """Every run of the grid, the chains, the tuned runs and the studies, collected once (:class:`ReportData`)."""
    stats = noise_stats(params, layout)
    studies = {name: load_study(name) for name in study_names()}
    sections = {name: check_study(params, name) for name in studies}
    own = {name: studies[name].runs(params, sections[name]) for name in studies}  # sections validated once
    every_run = collect(runs_of(params) + [r for runs in own.values() for r in runs], layout, stats)
    kinds = every_run["run_kind"] if not every_run.empty else pd.Series(dtype=str)
    # the studies' own runs have their own sections, outside the grid's tables
    per_seed = every_run[kinds.isin(GRID_KINDS)]
    per_seed = per_seed.drop(columns=[c for c in per_seed.columns
                                      if c.startswith("final_") and not c.startswith("final_diag_")])
    names = [m for m in metric_names(params["evaluate"]["recall_at"]) if m in per_seed.columns]
    names += [m for m in (*VERIFICATION_METRICS, "tar_at_far_1e-05_false_accepts", "tar_at_far_1e-05_identities_low",
                          "tar_at_far_1e-05_identities_high") if m in per_seed.columns]
    timing = timing_results(params, layout)
    # a dataset's own labels are its noise: the real-noise benchmarks, and any whose truth shows wrong labels
    noise_names = {(d, n): noise_name(stats[d, n], params["datasets"][d]["kind"] in REAL_NOISE_KINDS
                                      or (stats[d, n]["kind"] == "none" and stats[d, n]["actual_rate"] > 0))
                   for d, n in stats}
    claims = [(study.title, claim) for study in studies.values() for claim in study.claims]
    ordering = orderings.paired(per_seed, claims, "precision_at_1", noise_names, lambda r: main_table.label(r, params),
                                params["report"]["uncertainty"])
    return ReportData(
        params=params, layout=layout, stats=stats, studies=studies, sections=sections, own=own, every_run=every_run,
        per_seed=per_seed, study_rows=every_run[~kinds.isin(GRID_KINDS)], names=names,
        summary=summarise(per_seed, names + [BEST_ON_TEST]),  # the last: test-selected, labelled where shown
        noise=noise_table(stats), selection=selection_summary(per_seed), weights=weight_summary(per_seed),
        timing=timing, times=timing_table(timing), clusters=cluster_size_table(stats),
        references=load_references(layout.root / "references" / "papers"), noise_names=noise_names,
        ordering=ordering)


def _results_lines(d: ReportData) -> list[str]:
    """The grid's results: the main table, the budget, the chained and tuned runs, the claims' orderings, face
    verification."""
    params, labels = d.params, d.params["report"]["labels"]
    chains = [_chain_line(c, labels, d.noise_names) for c in params["chains"].values()]
    md = ["# Results", ""]
    if params["report"]["rehearsal"]:
        md += [f"> **Rehearsal**: {REHEARSAL_NOTE}", ""]
    md += main_table.markdown(d.summary, params, d.noise_names)
    md += budget.markdown(budget.table(d.per_seed, params, main_table.row_names(params),
                                       lambda r: main_table.label(r, params)))
    if chains:
        md += ["Chained runs (params.yaml `chains`; each is a DVC stage that depends on its upstream run):", "",
               *chains, ""]
    md += tuning_lines(params, d.layout)
    md += [f"![P@1 against the noise rate]({FIGURES}/p_at_1_vs_noise.png)", ""]
    md += orderings.section(d.ordering, "precision_at_1", params["report"]["uncertainty"])
    md += verification_markdown(d.summary, labels, d.noise_names)
    return md


def _noise_lines(d: ReportData) -> list[str]:
    """What each noise setting did to the training labels, and the moved clusters' sizes."""
    md = ["## Noise settings", "",
          "What each setting did to the training labels. Flip rate: share of a class's own images "
          "relabelled; impurity: share of a kept training label's samples that are not of that class.", "",
          noise_markdown(d.noise, d.noise_names), ""]
    if d.clusters is not None:
        md += ["### Moved clusters (small-cluster noise): number of clusters of each size", "",
               d.clusters.rename(columns=lambda c: _setting(c, d.noise_names)).to_markdown(), ""]
    md += [f"![Per-class noise]({FIGURES}/noise_per_class.png)", ""]
    return md


def _selection_and_weight_lines(d: ReportData) -> list[str]:
    """The methods that select or weight samples, scored with the ground truth they never see."""
    labels = d.params["report"]["labels"]
    md = ["## Sample selection", ""]
    if d.selection.empty:
        md += ["No run of the grid selects samples.", ""]
    else:
        md += ["Methods that select samples: at the final epoch, the share of kept samples that are truly clean "
               "(precision) and of truly clean samples that are kept (recall), in %, from the corrupt stage's ground "
               "truth, mean over seeds. A selection no better than chance has precision = the clean labels' share.",
               "", shares_markdown(d.selection, ["clean_fraction", *[f"final_{c}" for c in SELECTION_COLUMNS]], labels,
                                   d.noise_names), "",
               f"![Selection over training]({FIGURES}/selection_over_training.png)", ""]
    md += ["## Sample weights", ""]
    if d.weights.empty:
        md += ["No run of the grid weights samples.", ""]
    else:
        md += ["Methods that weight samples: the final mean weight of truly clean and truly noisy training samples "
               "(ground truth the method never sees), mean over seeds, and their histograms.", "",
               shares_markdown(d.weights, ["mean weight, clean", "mean weight, noisy"], labels, d.noise_names,
                               digits=3, as_percent=False), "",
               f"![Weights of clean and noisy samples]({FIGURES}/weights_clean_noisy.png)", ""]
    return md


def _study_lines(d: ReportData) -> list[str]:
    """Every study's own sections (each writes its CSVs and figures as it goes)."""
    md = []
    for name, study in d.studies.items():
        runs = {r.name: r for r in d.own[name]}
        mine = d.study_rows[d.study_rows["method"].isin(runs)] if not d.study_rows.empty else d.study_rows
        folder = d.out / "studies" / name
        folder.mkdir(parents=True, exist_ok=True)
        md += study.report(ReportContext(params=d.params, sections=d.sections[name], per_seed=d.per_seed,
                                         summary=d.summary, own_runs=mine, runs=runs, references=d.references,
                                         timing=d.timing, out=folder, figures=d.figures, noise_names=d.noise_names))
    return md


def _time_lines(d: ReportData) -> list[str]:
    """Training time, and the runs whose MAP@R is an underestimate."""
    md = ["## Training time", ""]
    if d.times.empty:
        md += ["Not timed: list methods under `timing.entries` in params.yaml (its comment shows how).", ""]
    else:
        md += [f"Seconds per epoch on the same data (`timing` in params.yaml: {d.params['timing']['epochs']} epochs "
               "each, the first not counted); the studies' sections put the papers' times beside them.", "",
               d.times.to_markdown(index=False), ""]
    inexact = d.per_seed[~d.per_seed["map_at_r_exact"].astype(bool)]
    if not inexact.empty:
        md += ["**MAP@R and R-Precision are underestimates** for "
               + ", ".join(f"{r.dataset}/{r.noise}/{r.method}/seed{r.seed}" for r in inexact.itertuples())
               + f": `evaluate.max_k` ({d.params['evaluate']['max_k']}) is below the largest test class - 1.", ""]
    return md


def _draw_figures(d: ReportData) -> pd.DataFrame:
    """The report's generic figures; returns the points of P@1 against the noise rate (what `dvc plots` draws)."""
    params, labels, groups = d.params, d.params["report"]["labels"], d.params["report"]["panels"]
    shown = plot_series(d.summary)
    shown = shown[~shown["method"].isin(main_table.reference_rows(params))]  # not methods: no panel
    styles = run_styles(main_table.row_names(params))  # one colour per run in every figure
    # the figure and `dvc plots show` draw the same points (reports/plots/p_at_1_vs_noise.csv)
    drawn = noise_points(shown, "precision_at_1", groups, labels)
    plot_metric_vs_noise(drawn, "precision_at_1", d.figures / "p_at_1_vs_noise.png",
                         main_table.metric_head("precision_at_1"), styles=styles)
    panel = {(ds, n): f"{ds}, {d.noise_names[ds, n]}" for ds, n in d.stats}
    per_class = {panel[ds, n]: pd.read_csv(d.layout.noisy(ds, n) / "per_class.csv")
                 for ds in params["grid"]["datasets"] for n in noises_of(params["grid"])}
    nominal = {panel[r.dataset, r.noise]: r.nominal_rate for r in d.noise.itertuples()}
    plot_noise_per_class(per_class, nominal, d.figures / "noise_per_class.png", vector=True)
    if not d.selection.empty:
        plot_selection(d.per_seed, d.figures / "selection_over_training.png", labels, styles, d.noise_names)
    if not d.weights.empty:
        plot_weight_histograms(d.per_seed, d.figures / "weights_clean_noisy.png", vector=True, labels=labels,
                               noise_names=d.noise_names)
    return drawn


def _write_metrics(d: ReportData) -> None:
    """Every metric of every run, mean over seeds (:data:`ALL_METRICS`, what CI compares), and DVC's headline
    metrics."""
    def rounded(row: dict) -> dict:  # a metric a row has no value of (a face metric on glyphs) is left out
        return {m: round(float(row[m]), 6) for m in d.names if pd.notna(row[m])}

    combined = {f"{r['dataset']}/{r['noise']}/{r['method']}": rounded(r) for r in d.summary.to_dict("records")}
    own_means = d.study_rows.groupby(["dataset", "noise", "method"], sort=False)[d.names].mean().reset_index() \
        if not d.study_rows.empty else d.study_rows
    combined.update({f"{r['dataset']}/{r['noise']}/{r['method']}": rounded(r) for r in own_means.to_dict("records")})
    io.write_json(d.out / ALL_METRICS, combined)
    write_headline(d.summary, d.params, d.out / HEADLINE)


def write_report(params: dict, layout: Layout) -> Path:
    """``reports/``: results.md (the generic sections, then every study's), its tables as CSV and LaTeX, the
    figures, the plots' data and the combined metrics."""
    d = gather(params, layout)
    out = d.out
    md = _results_lines(d) + _noise_lines(d) + _selection_and_weight_lines(d) + _study_lines(d)
    references_md, status = reference_section(d.references, d.summary, params, d.stats)
    md += references_md + _time_lines(d)
    io.write_text(out / "results.md", "\n".join(md))
    io.write_text(out / "results.tex", main_table.latex(d.summary, params, d.noise_names))
    io.write_with(out / "results.csv", lambda p: d.summary.to_csv(p, index=False, float_format="%.6f"))
    # per-epoch curves live in metrics/*.json
    flat = d.every_run.drop(columns=[c for c in d.every_run.columns
                                     if c.startswith(("diag_", "histogram_", "curve_", "per_class_"))])
    io.write_with(out / "results_per_seed.csv", lambda p: flat.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "noise_stats.csv", lambda p: d.noise.to_csv(p, index=False))
    drawn = _draw_figures(d)
    io.write_with(out / "orderings.csv", lambda p: orderings.to_csv_rows(d.ordering).to_csv(p, index=False,
                                                                                           float_format="%.6f"))
    io.write_with(out / "selection.csv", lambda p: d.selection.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "paper_status.csv", lambda p: status.to_csv(p, index=False))
    io.write_with(out / "training_time.csv", lambda p: d.times.to_csv(p, index=False))
    # Plot data for `dvc plots show` (dvc.yaml `plots`): the figure's own points, methods told apart by `method`
    io.write_with(out / "plots" / "p_at_1_vs_noise.csv", lambda p: drawn.to_csv(p, index=False, float_format="%.4f"))
    _write_metrics(d)
    print((out / "results.md").read_text())
    return out
