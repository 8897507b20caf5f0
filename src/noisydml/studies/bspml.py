"""BSPML (AAAI 2023) as a study: its figures' own runs, its checks and its report sections.

- ``figures.bspml_maps``: MAW / SDAW maps over (mu, lambda) from one grid run's final model (Figs. 3-4, the
  fixed-xi reading; the ``bspml_maps`` stage draws them);
- ``figures.embedding_size``: Fig. 5, Recall@1 against the embedding size, one run per method x dim x seed;
- ``figures.bspml_cells``: Figs. 3-4 retrained per (lambda, mu) cell, one ``bspml`` run per cell and seed, the age
  held at lambda (``lambda_0 = lambda_inf = lambda``, ``age_multiplier = 1``, so the axis means one thing);
- the report's Table 1 / Table 2 layouts, Fig. 5 and the per-cell maps.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import pandas as pd

from noisydml import io
from noisydml.reporting.plots import plot_embedding_size, plot_grid_maps
from noisydml.sections.grid import noises_of
from noisydml.runs import Run, RunKind

#: Fig. 5's points: a method at one embedding size (stage train_embedding_size@<method>-<dim>-<seed>)
EMBEDDING_SIZE = RunKind("embedding_size", "train_embedding_size")
#: Figs. 3-4's retrained cells: BSPML at one (lambda, mu) (stage train_bspml_cell@<lambda>-<mu>-<seed>)
BSPML_CELL = RunKind("bspml_cell", "train_bspml_cell")
from noisydml.schema import (
    Field, ParamsError, check_choice, check_name, check_section, check_unique, mapping_or_empty,
)
from noisydml.studies.base import Claim, ReportContext, Study, check_run_target, percent

BSPML_MAP_SCHEMA = {
    "dataset": Field(str), "noise": Field(str), "seed": Field(int),
    "method": Field(str, "bspml", choices=("bspml", "spms"),
                    help="the grid run whose final model gives xi (and whose weight-step settings are used)"),
    "lambdas": Field(list, item_type=float, min=0.0, help="the age, held constant per cell"),
    "mus": Field(list, item_type=float, min=0.0, help="the balance weight"),
    "passes": Field(int, 36, min=1, help="ours: weight-step passes over N from all weights 1"),
}
BSPML_CELLS_SCHEMA = {
    "dataset": Field(str, help="a dataset of grid.datasets"),
    "noise": Field(str, help="a noise setting the grid trains on (its labels are made by the corrupt stage)"),
    "lambdas": Field(list, item_type=float, min=0.0, help="the age of a cell: lambda_0 = lambda_inf = it, c = 1"),
    "mus": Field(list, item_type=float, min=0.0, help="the balance weight of a cell"),
    "seeds": Field(list, item_type=int, min=0, help="seeds of every cell"),
}
EMBEDDING_SIZE_SCHEMA = {
    "dataset": Field(str, help="a dataset of grid.datasets"),
    "noise": Field(str, help="a noise setting the grid trains on (its labels are made by the corrupt stage)"),
    "methods": Field(list, item_type=str, help="methods of the methods section (not only the grid's)"),
    "dims": Field(list, item_type=int, min=1, help="train.embedding_dim of each point; [] = no runs, no figure"),
    "seeds": Field(list, item_type=int, min=0, help="seeds of every point"),
}


def check_maps(section: Any, p: dict[str, Any]) -> dict[str, Any]:
    """``figures.bspml_maps``: each ``<name>`` is a stage ``bspml_maps@<name>`` drawing from a run of the grid (a DVC
    edge)."""
    maps = {}
    for name, raw_entry in mapping_or_empty(section, "figures.bspml_maps", "map").items():
        where = f"figures.bspml_maps.{check_name(name, 'figures.bspml_maps')}"
        entry = check_section(raw_entry, BSPML_MAP_SCHEMA, where)
        grid = p["grid"]
        check_choice(entry["dataset"], grid["datasets"], f"{where}.dataset", "dataset of grid.datasets")
        check_choice(entry["noise"], noises_of(grid), f"{where}.noise", "noise setting the grid trains on")
        if entry["method"] not in grid["methods"]:
            raise ParamsError(f"{where}.method: {entry['method']!r} is not a method of grid.methods (the map is "
                              f"drawn from that run); allowed: {', '.join(grid['methods'])}; or drop the map: "
                              "-S '~figures.bspml_maps' -S '+figures.bspml_maps={}'")
        if entry["seed"] not in grid["seeds"]:
            raise ParamsError(f"{where}.seed: {entry['seed']!r} is not a seed of the grid; allowed: "
                              f"{', '.join(map(str, grid['seeds']))}")
        for key in ("lambdas", "mus"):
            if not entry[key]:
                raise ParamsError(f"{where}.{key}: must list at least one value")
        maps[name] = entry
    return maps


def check_cells(section: Any, p: dict[str, Any]) -> dict[str, Any]:
    """``figures.bspml_cells``: stage ``train_bspml_cell@<lambda>-<mu>-<seed>`` per cell (a DVC matrix), each a
    ``bspml`` run with the age held at lambda (``lambda_0 = lambda_inf = lambda``, ``age_multiplier = 1``) and
    ``mu``; the report draws MAW / SDAW / Recall@1 over the cells. Names keep the values as written (``str``)."""
    where = "figures.bspml_cells"
    raw = dict(section) if isinstance(section, Mapping) else section
    entry = check_section(raw, BSPML_CELLS_SCHEMA, where)
    for key in ("lambdas", "mus", "seeds"):
        check_unique(entry[key], f"{where}.{key}")
    entry["lambda_names"] = [str(v) for v in raw["lambdas"]]
    entry["mu_names"] = [str(v) for v in raw["mus"]]
    if entry["lambdas"] or entry["mus"]:
        if not (entry["lambdas"] and entry["mus"] and entry["seeds"]):
            raise ParamsError(f"{where}: needs at least one lambda, one mu and one seed, or lambdas: [] (no cells)")
        if any(v == 0 for v in entry["lambdas"]):
            raise ParamsError(f"{where}.lambdas: 0 is not allowed (the age must be > 0; Alg. 1)")
        check_run_target(entry, p, where)
        if "bspml" not in p["methods"]:
            raise ParamsError(f"{where}: needs methods.bspml (every cell overrides its age and mu)")
    return entry


def check_embedding_size(section: Any, p: dict[str, Any]) -> dict[str, Any]:
    """``figures.embedding_size``: stage ``train_embedding_size@<method>-<dim>-<seed>`` per point (a DVC matrix)."""
    where = "figures.embedding_size"
    entry = check_section(section, EMBEDDING_SIZE_SCHEMA, where)
    # dataset and noise are checked only when there are runs: the paper's 20% per-class noise may stay out of the
    # default grid, and a shrunk grid need not carry the figure's dataset
    if entry["dims"]:
        check_run_target(entry, p, where)
    for i, method in enumerate(entry["methods"]):
        check_choice(method, list(p["methods"]), f"{where}.methods[{i}]", "method")
    for key in ("methods", "dims", "seeds"):
        check_unique(entry[key], f"{where}.{key}")
    if entry["dims"] and not (entry["methods"] and entry["seeds"]):
        raise ParamsError(f"{where}: dims {entry['dims']} needs at least one method and one seed")
    return entry


def runs(params: dict[str, Any], sections: dict[str, Any]) -> list[Run]:
    """The figures' own runs: Fig. 5's points (``<method>_dim<dim>``) and the retrained cells
    (``bspml_lam<lambda>_mu<mu>``, the values named as DVC writes them in the stage's name and path: Python's str
    of the YAML value, 3.1 or 20, so both name the same folder)."""
    sizes, cells = sections["embedding_size"], sections["bspml_cells"]
    out = [Run(EMBEDDING_SIZE, f"{m}-{dim}-{s}", sizes["dataset"], sizes["noise"],
               f"{m}_dim{dim}", s, m, train={"embedding_dim": dim}, point={"embedding_dim": dim})
           for m, dim, s in itertools.product(sizes["methods"], sizes["dims"], sizes["seeds"])]
    for (lam_name, lam), (mu_name, mu), s in itertools.product(zip(cells["lambda_names"], cells["lambdas"]),
                                                              zip(cells["mu_names"], cells["mus"]), cells["seeds"]):
        out.append(Run(BSPML_CELL, f"{lam_name}-{mu_name}-{s}", cells["dataset"], cells["noise"],
                       f"bspml_lam{lam_name}_mu{mu_name}", s, "bspml",
                       hparams={"lambda_0": lam, "lambda_inf": lam, "age_multiplier": 1.0, "mu": mu,
                                "age_unit": "absolute"},  # the figures' axis: the paper's lambda
                       point={"lambda": lam, "mu": mu}))
    return out


def table1(summary: pd.DataFrame, params: dict) -> list[str]:
    """BSPML's Table 1 layout: retrieval and clustering on clean labels, Recall@K (the paper's K = 1..32 that
    ``evaluate.recall_at`` has) and NMI in %, rows = methods; one table per dataset trained on clean labels."""
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k in params["evaluate"]["recall_at"]]
    metrics = [f"recall_at_{k}" for k in ks] + (["nmi"] if params["evaluate"]["nmi"] else [])
    clean = summary[summary["noise_kind"] == "none"]
    out = []
    for (dataset, noise), group in clean.groupby(["dataset", "noise"], sort=False):
        out += [f"**{dataset}, clean labels** (mean over seeds ± sample SD, %)", "",
                "| method | " + " | ".join([f"R@{k}" for k in ks] + (["NMI"] if "nmi" in metrics else [])) + " |",
                "|" + "---|" * (len(metrics) + 1)]
        for row in group.to_dict("records"):
            if row["method"] in params["report"]["reference_rows"]:
                continue  # not a method (report.reference_rows): the main table shows it for reference
            label = params["report"]["labels"].get(row["method"], row["method"])
            out.append(f"| {label} | " + " | ".join(percent(row, m) for m in metrics) + " |")
        out.append("")
    return out


def table2(summary: pd.DataFrame, labels: dict[str, str] | None = None, reference_rows=()) -> list[str]:
    """BSPML's Table 2 layout: Recall@1 ± sample SD (%) under per-class symmetric noise, rows = (dataset,
    noise rate), columns = methods (not ``reference_rows``)."""
    noisy = summary[(summary["noise_kind"] == "symmetric_per_class") & ~summary["method"].isin(list(reference_rows))]
    noisy = noisy.sort_values(["dataset", "noise_rate"], kind="stable")
    if noisy.empty:
        return []
    methods = list(dict.fromkeys(noisy["method"]))
    labels = labels or {}
    out = ["| data | NR | " + " | ".join(labels.get(m, m) for m in methods) + " |", "|" + "---|" * (len(methods) + 2)]
    for (dataset, noise), group in noisy.groupby(["dataset", "noise"], sort=False):
        cells = {row["method"]: percent(row, "recall_at_1") for row in group.to_dict("records")}
        rate = group["noise_rate"].iloc[0]
        out.append(f"| {dataset} | {100 * rate:g}% | " + " | ".join(cells.get(m, "–") for m in methods) + " |")
    return out + [""]


def embedding_size_summary(sweep: pd.DataFrame, runs: dict[str, Run]) -> pd.DataFrame:
    """``figures.embedding_size`` runs: Recall@1 and P@1 per (method, embedding size), mean and sample SD over
    seeds. ``runs``: run name -> its :class:`~noisydml.runs.Run`, whose method and point place each row."""
    columns = ["method", "embedding_dim", "seeds", "recall_at_1", "recall_at_1_std", "precision_at_1",
               "mean_average_precision_at_r"]
    if sweep.empty:
        return pd.DataFrame(columns=columns)
    rows = sweep.assign(method=[runs[r].method for r in sweep["method"]],
                        embedding_dim=[runs[r].point["embedding_dim"] for r in sweep["method"]])
    grouped = rows.groupby(["method", "embedding_dim"], sort=False)
    metrics = [m for m in ("recall_at_1", "precision_at_1", "mean_average_precision_at_r") if m in rows]
    out = grouped[metrics].mean()
    out["recall_at_1_std"] = grouped["recall_at_1"].std(ddof=1)
    out["seeds"] = grouped.size()
    return out.reset_index()[columns]


def embedding_size_lines(table: pd.DataFrame, sizes: dict) -> list[str]:
    """The report's section for BSPML Fig. 5: Recall@1 ± SD (%), rows = methods, columns = embedding sizes."""
    if table.empty:
        return ["(opt-in: set `figures.embedding_size.dims` in params.yaml, e.g. `[16,32,64,128]`, with its noise "
                f"`{sizes['noise']}` in grid.noises; params.yaml `figures.embedding_size` shows the command)", ""]
    dims = sorted(table["embedding_dim"].unique())
    out = [f"Recall@1 in % on {sizes['dataset']} / {sizes['noise']} (mean ± sample SD over "
           f"{table['seeds'].max()} seed(s)); every other setting is the grid's `train` section.", "",
           "| method | " + " | ".join(f"d = {d}" for d in dims) + " |", "|" + "---|" * (len(dims) + 1)]
    indexed = table.set_index(["method", "embedding_dim"])
    for method in dict.fromkeys(table["method"]):
        cells = [percent(indexed.loc[(method, d)], "recall_at_1") if (method, d) in indexed.index else "-" for d in dims]
        out.append(f"| {method} | " + " | ".join(cells) + " |")
    return out + [""]


def bspml_cells_summary(cell_runs: pd.DataFrame, runs: dict[str, Run]) -> pd.DataFrame:
    """``figures.bspml_cells`` runs: final MAW, SDAW (the last weight step's, Eq. 14) and Recall@1 per
    (lambda, mu), mean over seeds. ``runs``: run name -> its :class:`~noisydml.runs.Run` (its point)."""
    columns = ["lambda", "mu", "seeds", "maw", "sdaw", "recall_at_1"]
    if cell_runs.empty:
        return pd.DataFrame(columns=columns)
    rows = cell_runs.assign(**{"lambda": [runs[m].point["lambda"] for m in cell_runs["method"]],
                               "mu": [runs[m].point["mu"] for m in cell_runs["method"]]})
    rows = rows.rename(columns={"final_bspml_maw": "maw", "final_bspml_sdaw": "sdaw"})
    grouped = rows.groupby(["lambda", "mu"], sort=True)
    out = grouped[[c for c in ("maw", "sdaw", "recall_at_1") if c in rows]].mean().reindex(
        columns=["maw", "sdaw", "recall_at_1"])
    out["seeds"] = grouped.size()
    return out.reset_index()[columns]


def bspml_cells_lines(table: pd.DataFrame, cells: dict) -> list[str]:
    """The report's section for the per-cell retrained BSPML maps."""
    if table.empty:
        return ["(opt-in: set `figures.bspml_cells.lambdas` and `mus` in params.yaml, with its noise "
                f"`{cells['noise']}` in grid.noises; params.yaml `figures.bspml_cells` shows the command. The fixed-xi maps of `figures.bspml_maps` "
                "are the cheap reading.)", ""]
    return [f"One `bspml` run per cell on {cells['dataset']} / {cells['noise']}, its age held at lambda "
            "(lambda_0 = lambda_inf = lambda, c = 1) and balance mu; MAW / SDAW (Eq. 14) after the last weight step, "
            f"Recall@1 in %, mean over {table['seeds'].max()} seed(s).", "",
            "| lambda | mu | MAW | SDAW | R@1 |", "|---|---|---|---|---|",
            *[f"| {r['lambda']:g} | {r['mu']:g} | {r['maw']:.4f} | {r['sdaw']:.4f} | {100 * r['recall_at_1']:.2f} |"
              for r in table.to_dict("records")], ""]


def report(ctx: ReportContext) -> list[str]:
    """Table 1 / Table 2 layouts of the grid's results, Fig. 5 and the per-cell maps (with their CSVs and plots)."""
    params, summary, out = ctx.params, ctx.summary, ctx.out
    kinds = ctx.own_runs["run_kind"] if not ctx.own_runs.empty else pd.Series(dtype=str)
    sizes = embedding_size_summary(ctx.own_runs[kinds == "embedding_size"], ctx.runs)
    cells = bspml_cells_summary(ctx.own_runs[kinds == "bspml_cell"], ctx.runs)
    fig5, cell_section = ctx.sections["embedding_size"], ctx.sections["bspml_cells"]
    md = ["## BSPML's table layouts", "",
          "Table 1 (clean labels; the paper: CUB, Cars, In-shop, SOP) and Table 2 (Recall@1 under per-class "
          "symmetric noise, `symmetric_per_class`; the paper: 10/20/30% on CUB, Cars, In-shop), our rows for the "
          "methods of the grid. Its MS and BSPML use rho = 1 (`ms_rho1`, `bspml`); `ms` is pml's rho = 0.5. Its "
          "RDML column is `rdml_tuned` (eta chosen on held-out training classes from {0.5, 1, 2, 3, 4}, "
          "`tuning.sampler.name: grid`); `rdml` is the untuned eta = 1.", ""]
    md += (table1(summary, params) if "recall_at_1" in summary else []) or \
        ["(Table 1: no clean-label noise setting in the grid)", ""]
    md += (table2(summary, params["report"]["labels"], params["report"]["reference_rows"])
           if "recall_at_1" in summary else []) or \
        ["(Table 2: no per-class noise setting in the grid: add sympc10, sympc20, sympc30 to grid.noises)", ""]
    md += ["## Embedding size (BSPML Fig. 5)", "", *embedding_size_lines(sizes, fig5)]
    if not sizes.empty:
        md += [ctx.embed("embedding_size", "Recall@1 against embedding size"), ""]
        plot_embedding_size(sizes, f"Recall@1 against embedding size, {fig5['dataset']}, "
                            f"{ctx.noise_names.get((fig5['dataset'], fig5['noise']), fig5['noise'])}",
                            ctx.figure("embedding_size"), empty="", vector=True)
    io.write_with(out / "embedding_size.csv", lambda p: sizes.to_csv(p, index=False, float_format="%.6f"))
    md += ["## BSPML retrained per cell (Figs. 3-4)", "", *bspml_cells_lines(cells, cell_section)]
    if not cells.empty:
        md += [ctx.embed("bspml_cells", "MAW, SDAW and Recall@1 over (mu, lambda)"), ""]
        plot_grid_maps(cells, f"BSPML retrained per cell, {cell_section['dataset']}, "
                       f"{ctx.noise_names.get((cell_section['dataset'], cell_section['noise']), cell_section['noise'])}"
                       " (mean over seeds)", ctx.figure("bspml_cells"), columns=("maw", "sdaw", "recall_at_1"),
                       empty="", vector=True)
    io.write_with(out / "bspml_cells.csv", lambda p: cells.to_csv(p, index=False, float_format="%.6f"))
    return md


STUDY = Study(
    name="bspml",
    title="BSPML (AAAI 2023)",
    sections={"bspml_maps": check_maps, "embedding_size": check_embedding_size, "bspml_cells": check_cells},
    kinds=(EMBEDDING_SIZE, BSPML_CELL),
    runs=runs,
    report=report,
    claims=(Claim("bspml", "ms_rho1", "BSPML above MS at its rho = 1 (Table 2)",
                            diagnostics=(("final_diag_weight_clean", "mean weight, clean"),
                                         ("final_diag_weight_noisy", "mean weight, noisy"))),),
)
