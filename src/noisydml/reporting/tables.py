"""The report stage: results table (Markdown + CSV), noise statistics, plots, combined metrics.

Only the runs of the current grid in params.yaml are read: DVC leaves files of
removed grid entries on disk, and they must not leak into the tables. A
missing metrics file is an error, not a hole in the table.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from noisydml import io
from noisydml.runs import Run, noises_of, runs_of


def row_names(params: dict) -> list[str]:
    """Rows of the results table: the grid's methods, then the chained runs' names."""
    return list(dict.fromkeys([*params["grid"]["methods"], *(c["name"] for c in params["chains"].values())]))


def collect(params: dict, layout, stats: dict[tuple[str, str], dict]) -> pd.DataFrame:
    rows = []
    for run in runs_of(params):
        dataset, noise, method, seed, kind = run.dataset, run.noise, run.name, run.seed, run.kind
        path = layout.metrics(dataset, noise, method, seed)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run `dvc repro` to evaluate every run of the grid")
        result = io.read_json(path)
        setting = stats[dataset, noise]
        training = result.get("training", {})
        rows.append({
            "dataset": dataset, "noise": noise, "noise_kind": setting["kind"],
            "noise_rate": setting["nominal_rate"], "actual_noise_rate": setting["actual_rate"],
            "method": method, "run_kind": kind, "seed": seed, **result["metrics"],
            "map_at_r_exact": result.get("map_at_r_exact", True), "k_used": result.get("k_used"),
            **{f"pseudo_label_{k}": v for k, v in result.get("pseudo_labels", {}).items()},
            # the trainer's scores of the method's decisions: per-epoch lists and final values
            **{k: v for k, v in training.items() if k.startswith(("diag_", "final_diag_", "histogram_", "curve_"))},
            **{f"final_{k}": v for k, v in training.get("final_logged", {}).items() if kind == "bspml_cell"},
        })
    return pd.DataFrame(rows)


#: Scores of sample selection (the trainer's ``diag_*`` of a method's keep decisions).
SELECTION_COLUMNS = ("diag_selection_precision", "diag_selection_recall", "diag_kept_fraction")

#: PRISM (CVPR 2021), training time on CARS-98N in seconds (the slides' last table), keyed by
#: (method, centres): our timing rows are matched to it.
PAPER_TRAINING_SECONDS = {
    ("mcl", None): ("Memory Contrastive Loss (MCL)", 1679.22),
    ("prism", False): ("MCL + PRISM without centers", 12294.76),
    ("prism", True): ("MCL + PRISM with centers", 1777.38),
    ("softtriple", None): ("Soft Triple", 1685.47),
    ("softtriple_prism", True): ("Soft Triple + PRISM with centers", 1767.97),
}


def summarise(per_seed: pd.DataFrame, metric_names: list[str]) -> pd.DataFrame:
    """Mean and sample standard deviation (ddof=1; NaN for one seed) over seeds of every metric, one row per
    (dataset, noise, method)."""
    keys = ["dataset", "noise", "noise_kind", "noise_rate", "actual_noise_rate", "method"]
    grouped = per_seed.groupby(keys, sort=False)[metric_names]
    mean = grouped.mean()
    std = grouped.std(ddof=1).add_suffix("_std")
    out = pd.concat([mean, std], axis=1).reset_index()
    out.insert(len(keys), "seeds", grouped.size().to_numpy())
    return out


def _selection_text(train: dict) -> str:
    if train["model_selection"] == "best_validation":
        return (f"model of the epoch with the best validation P@1 on {train['validation_classes']} held-out "
                "training classes; the test set never selects")
    return "final epoch, no test-set model selection"


def markdown_table(summary: pd.DataFrame, metrics: list[str], params: dict) -> str:
    """Rows = methods, columns = dataset x noise, cells = the chosen metrics in percent."""
    short = {"precision_at_1": "P@1", "mean_average_precision_at_r": "MAP@R", "r_precision": "RP", "nmi": "NMI"}
    short.update({f"recall_at_{k}": f"R@{k}" for k in params["evaluate"]["recall_at"]})
    grid = params["grid"]
    columns = [(d, n) for d in grid["datasets"] for n in noises_of(grid)]
    header = "| method | " + " | ".join(f"{d} / {n}" for d, n in columns) + " |"
    lines = [
        f"Cells: {' / '.join(short.get(m, m) for m in metrics)} in %, mean over {len(grid['seeds'])} seed(s)"
        + (" (± sample standard deviation, ddof=1)" if len(grid["seeds"]) > 1 else "") + "; "
        + _selection_text(params["train"]) + ".",
        "",
        header,
        "|" + "---|" * (len(columns) + 1),
    ]
    indexed = summary.set_index(["dataset", "noise", "method"])
    for method in row_names(params):
        cells = []
        for d, n in columns:
            if (d, n, method) not in indexed.index:
                cells.append("-")  # a chained run exists only where its entry in `chains` puts it
                continue
            row = indexed.loc[(d, n, method)]
            parts = []
            for m in metrics:
                text = f"{100 * row[m]:.1f}"
                if row["seeds"] > 1 and pd.notna(row[m + "_std"]):
                    text += f"±{100 * row[m + '_std']:.1f}"
                parts.append(text)
            cells.append(" / ".join(parts))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt_range(summary: dict) -> str:
    if not summary or summary.get("mean") is None:
        return "-"
    return f"{summary['min']:.2f} / {summary['mean']:.2f} / {summary['max']:.2f}"


def noise_stats(params: dict, layout) -> dict[tuple[str, str], dict]:
    """The corrupt stage's stats.json of every (dataset, noise setting) of the grid."""
    return {(d, n): io.read_json(layout.noisy(d, n) / "stats.json")
            for d in params["grid"]["datasets"] for n in noises_of(params["grid"])}


def noise_table(stats: dict[tuple[str, str], dict]) -> pd.DataFrame:
    """One row per (dataset, noise setting): what the noise did."""
    rows = []
    for (dataset, noise), s in stats.items():
        clusters = s.get("moved_clusters")
        verified = s.get("verified")
        rows.append({
            "dataset": dataset, "noise": noise, "kind": s["kind"], "nominal_rate": s["nominal_rate"],
            "actual_rate": round(s["actual_rate"], 4), "samples": s["num_samples"], "noisy": s["num_noisy"],
            "classes_before": s["num_classes_before"], "classes_after": s["num_classes_after"],
            "class_flip_rate (min/mean/max)": _fmt_range(s.get("flip_rate_per_class")),
            "class_impurity (min/mean/max)": _fmt_range(s.get("impurity_per_class")),
            "dissolved_classes": s.get("num_dissolved_classes", "-"),
            "moved_clusters": clusters["count"] if clusters else "-",
            "cluster_size (mean/max)": f"{clusters['mean_size']:.2f} / {clusters['max_size']}" if clusters and clusters["count"] else "-",
            "verified_noisy/verified": f"{verified['num_verified_noisy']}/{verified['num_verified']}" if verified else "-",
        })
    return pd.DataFrame(rows)


def cluster_size_table(stats: dict[tuple[str, str], dict]) -> pd.DataFrame | None:
    """Moved-cluster size distribution (small-cluster noise): rows = cluster size, columns = setting."""
    columns = {
        f"{dataset} / {noise}": {int(k): v for k, v in s["moved_clusters"]["size_histogram"].items()}
        for (dataset, noise), s in stats.items() if s.get("moved_clusters", {}).get("count")
    }
    if not columns:
        return None
    table = pd.DataFrame(columns).sort_index().fillna(0).astype(int)
    table.index.name = "cluster size"
    return table


def plot_series(summary: pd.DataFrame) -> pd.DataFrame:
    """Rows for the metric-vs-noise plots: clean runs (kind ``none``) are the rate-0 point of every
    synthetic kind's line, so they are repeated once per kind of their dataset."""
    parts = []
    for dataset, rows in summary.groupby("dataset", sort=False):
        kinds = [k for k in dict.fromkeys(rows["noise_kind"]) if k != "none"]
        clean = rows[rows["noise_kind"] == "none"]
        parts.append(rows[rows["noise_kind"] != "none"] if kinds else rows)
        for kind in kinds:
            parts.append(clean.assign(noise_kind=kind))
    return pd.concat(parts, ignore_index=True) if parts else summary


#: SGPS (TIP 2024) Table VI: whole-training GPU hours on an RTX 3090, CARS at 10% and 50% symmetric noise (K = 4).
SGPS_TABLE6_HOURS = {"prism": (0.307, 0.312), "sgps": (0.332, 0.361)}


def timing_table(params: dict, layout) -> pd.DataFrame:
    """Seconds per epoch of the ``timing`` stage's entries, with PRISM's and SGPS's published times beside them."""
    rows = []
    entries = list(params["timing"]["entries"])
    results = []
    for entry in entries:
        path = layout.timing(entry)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run `dvc repro timing@{entry}`")
        results.append(io.read_json(path))
    first = results[0] if results else None
    first_paper = PAPER_TRAINING_SECONDS.get((first["method"], first.get("centres"))) if first else None
    for r in results:
        paper = PAPER_TRAINING_SECONDS.get((r["method"], r.get("centres")))
        rows.append({
            "dataset": r["dataset"], "noise": r["noise"], "method": r["label"],
            "seconds/epoch": round(r["seconds_per_epoch"], 2),
            "ms/step": round(1e3 * r["seconds_per_step"], 1),
            "x first row": round(r["seconds_per_epoch"] / first["seconds_per_epoch"], 2),
            "PRISM paper (CARS-98N, s)": paper[1] if paper else "-",
            "paper x first row": round(paper[1] / first_paper[1], 2) if paper and first_paper else "-",
            "SGPS paper (CARS 10% / 50%, GPU h)": " / ".join(map(str, SGPS_TABLE6_HOURS[r["method"]]))
            if r["method"] in SGPS_TABLE6_HOURS and r.get("centres", True) else "-",
        })
    return pd.DataFrame(rows)


def selection_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Final-epoch selection precision / recall / kept fraction of runs that select samples."""
    columns = [f"final_{k}" for k in SELECTION_COLUMNS]
    rows = per_seed.dropna(subset=["final_diag_selection_precision"]) if "final_diag_selection_precision" in per_seed else per_seed.iloc[:0]
    keys = ["dataset", "noise", "method"]
    if rows.empty:
        return pd.DataFrame(columns=keys + ["clean_fraction", "seeds"] + columns)
    grouped = rows.groupby(keys, sort=False)
    out = grouped[columns].mean()
    out.insert(0, "clean_fraction", 1 - grouped["actual_noise_rate"].first())
    out.insert(1, "seeds", grouped.size())
    return out.reset_index()


def _pct(row, metric: str) -> str:
    text = f"{100 * row[metric]:.2f}"
    if row["seeds"] > 1 and pd.notna(row.get(metric + "_std")):
        text += f" ± {100 * row[metric + '_std']:.2f}"
    return text


def bspml_table1(summary: pd.DataFrame, params: dict) -> list[str]:
    """BSPML's Table 1 layout: retrieval and clustering on clean labels, Recall@K (the paper's K = 1..32 that
    ``evaluate.recall_at`` has) and NMI in %, rows = methods; one table per dataset trained on clean labels."""
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k in params["evaluate"]["recall_at"]]
    metrics = [f"recall_at_{k}" for k in ks] + (["nmi"] if params["evaluate"]["nmi"] else [])
    clean = summary[summary["noise_kind"] == "none"]
    out = []
    for (dataset, noise), group in clean.groupby(["dataset", "noise"], sort=False):
        out += [f"**{dataset} / {noise}** (mean over seeds ± sample SD, %)", "",
                "| method | " + " | ".join([f"R@{k}" for k in ks] + (["NMI"] if "nmi" in metrics else [])) + " |",
                "|" + "---|" * (len(metrics) + 1)]
        for row in group.to_dict("records"):
            out.append(f"| {row['method']} | " + " | ".join(_pct(row, m) for m in metrics) + " |")
        out.append("")
    return out


def bspml_table2(summary: pd.DataFrame) -> list[str]:
    """BSPML's Table 2 layout: Recall@1 ± sample SD (%) under per-class symmetric noise, rows = (dataset,
    noise rate), columns = methods."""
    noisy = summary[summary["noise_kind"] == "symmetric_per_class"].sort_values(["dataset", "noise_rate"], kind="stable")
    if noisy.empty:
        return []
    methods = list(dict.fromkeys(noisy["method"]))
    out = ["| data | NR | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 2)]
    for (dataset, noise), group in noisy.groupby(["dataset", "noise"], sort=False):
        cells = {row["method"]: _pct(row, "recall_at_1") for row in group.to_dict("records")}
        rate = group["noise_rate"].iloc[0]
        out.append(f"| {dataset} | {100 * rate:g}% | " + " | ".join(cells.get(m, "-") for m in methods) + " |")
    return out + [""]


def weight_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Final-epoch mean weight of truly clean and truly noisy samples of runs that weight samples (BSPML)."""
    columns = ["final_diag_weight_clean", "final_diag_weight_noisy"]
    if not set(columns) <= set(per_seed.columns):
        return pd.DataFrame()
    groups = per_seed.dropna(subset=columns).groupby(["dataset", "noise", "method"], sort=False)
    table = groups[columns].mean().rename(columns={"final_diag_weight_clean": "mean weight, clean",
                                                   "final_diag_weight_noisy": "mean weight, noisy"})
    table["seeds"] = groups.size()
    return table.reset_index()


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
                f"`{sizes['noise']}` in grid.noises; see the README)", ""]
    dims = sorted(table["embedding_dim"].unique())
    out = [f"Recall@1 in % on {sizes['dataset']} / {sizes['noise']} (mean ± sample SD over "
           f"{table['seeds'].max()} seed(s)); every other setting is the grid's `train` section.", "",
           "| method | " + " | ".join(f"d = {d}" for d in dims) + " |", "|" + "---|" * (len(dims) + 1)]
    indexed = table.set_index(["method", "embedding_dim"])
    for method in dict.fromkeys(table["method"]):
        cells = [_pct(indexed.loc[(method, d)], "recall_at_1") if (method, d) in indexed.index else "-" for d in dims]
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
                f"`{cells['noise']}` in grid.noises; see the README. The fixed-xi maps of `figures.bspml_maps` "
                "are the cheap reading.)", ""]
    return [f"One `bspml` run per cell on {cells['dataset']} / {cells['noise']}, its age held at lambda "
            "(lambda_0 = lambda_inf = lambda, c = 1) and balance mu; MAW / SDAW (Eq. 14) after the last weight step, "
            f"Recall@1 in %, mean over {table['seeds'].max()} seed(s).", "",
            "| lambda | mu | MAW | SDAW | R@1 |", "|---|---|---|---|---|",
            *[f"| {r['lambda']:g} | {r['mu']:g} | {r['maw']:.4f} | {r['sdaw']:.4f} | {100 * r['recall_at_1']:.2f} |"
              for r in table.to_dict("records")], ""]


#: Final-epoch SGPS diagnostics (the trainer's, from ground truth the method never sees).
SGPS_DIAGNOSTICS = {
    "final_diag_purity_bottom_up": "c^B purity", "final_diag_purity_top_down": "c^T purity",
    "final_diag_pool_true_positive": "noisy (closed-set): a true positive among candidates",
    "final_diag_pool_nonempty": "noisy (closed-set): any candidate",
    "final_diag_anchor_true_positive": "anchors: a true positive drawn",
    "final_diag_positive_precision": "drawn positives of the true class",
}


def sgps_diagnostics(per_seed: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in SGPS_DIAGNOSTICS if c in per_seed.columns]
    if not columns:
        return pd.DataFrame()
    rows = per_seed.dropna(subset=columns[:1])
    if rows.empty:
        return pd.DataFrame()
    grouped = rows.groupby(["dataset", "noise", "method"], sort=False)
    table = grouped[columns].mean().rename(columns=SGPS_DIAGNOSTICS)
    table["seeds"] = grouped.size()
    return table.reset_index()


def _chain_run_value(runs: pd.DataFrame, chain: dict, name: str, column: str):
    """``column`` of run ``name`` at a chain's dataset, noise and seed (``runs`` indexed by dataset, noise,
    method, seed); None when that run or column is absent."""
    index = (chain["dataset"], chain["noise"], name, chain["seed"])
    return runs.loc[index, column] if index in runs.index and column in runs.columns else None


def posterior_table(params: dict, per_seed: pd.DataFrame) -> pd.DataFrame:
    """Chains trained on an upstream's cluster labels (``labels.kind: clusters``; SGPS's posterior data clean,
    stage 2) and the chains trained after them (stage 3), one row per seed: each stage's P@1, and the purity
    (rows in their cluster's majority true class) and coverage (rows kept) of the exported clusters (measured by
    the evaluate stage)."""
    runs = per_seed.set_index(["dataset", "noise", "method", "seed"])
    rows = []
    for c in params["chains"].values():
        if c["labels"]["kind"] != "clusters":
            continue
        key = (c["dataset"], c["noise"])

        def value(name: str, column: str = "precision_at_1"):
            return _chain_run_value(runs, c, name, column)

        after = [d for d in params["chains"].values()
                 if d["upstream"] == c["name"] and (d["dataset"], d["noise"], d["seed"]) == (*key, c["seed"])]
        rows.append({
            "dataset": c["dataset"], "noise": c["noise"], "seed": c["seed"],
            f"stage 1: {c['upstream']} P@1": value(c["upstream"]),
            "clusters": value(c["name"], "pseudo_label_clusters"), "purity": value(c["name"], "pseudo_label_purity"),
            "coverage": value(c["name"], "pseudo_label_coverage"),
            f"stage 2: {c['name']} P@1": value(c["name"]),
            **{f"stage 3: {d['name']} P@1": value(d["name"]) for d in after},
        })
    return pd.DataFrame(rows)


def spa_table(params: dict, per_seed: pd.DataFrame) -> pd.DataFrame:
    """Smooth Proxy-Anchor, one row per chained phase-2 run (method ``spa_smooth_loss``) and seed: how phase 1's
    confidence module detects noisy labels (flagged = top-confidence class != given label; chance precision =
    the noise rate) and relabels (top class = true class), what phase 2 made of it (samples positive for no
    proxy, given labels dropped), and its P@1 beside Proxy-Anchor's on the same frozen backbone and MS's."""
    runs = per_seed.set_index(["dataset", "noise", "method", "seed"])
    rows = []
    for c in params["chains"].values():
        if c["method"] != "spa_smooth_loss":
            continue

        def value(name: str, column: str):
            v = _chain_run_value(runs, c, name, column)
            return None if v is None or pd.isna(v) else float(v)

        up, name = c["upstream"], c["name"]
        coverage, kept = value(name, "final_diag_pseudo_label_coverage"), value(name, "final_diag_kept_fraction")
        rows.append({
            "dataset": c["dataset"], "noise": c["noise"], "seed": c["seed"],
            "noise rate": value(name, "actual_noise_rate"),
            "flag precision": value(up, "final_diag_flag_precision"),
            "flag recall": value(up, "final_diag_flag_recall"),
            "confidence AUROC": value(up, "final_diag_confidence_auroc"),
            "relabelling accuracy": value(up, "final_diag_pseudo_label_accuracy"),
            "no positive proxy": None if coverage is None else 1 - coverage,
            "given label dropped": None if kept is None else 1 - kept,
            f"P@1 {name}": value(name, "precision_at_1"),
            **{f"P@1 {m}": value(m, "precision_at_1") for m in ("proxy_anchor_frozen", "proxy_anchor", "ms")
               if m in params["grid"]["methods"]},
        })
    return pd.DataFrame(rows)


#: SGPS Table V (CARS, 50% symmetric noise, SGPS-MCL): (tau, delta, gamma_1, gamma_2) -> (P@1, MAP@R) in %.
SGPS_TABLE5 = {
    (0.02, 0.1, 1.0, 0.1): (76.33, 20.90), (1.0, 0.1, 1.0, 0.1): (73.05, 18.56), (0.1, 0.1, 1.0, 0.1): (74.99, 19.63),
    (0.02, 0.0, 1.0, 0.1): (74.79, 19.80), (0.02, 0.3, 1.0, 0.1): (73.16, 18.56), (0.02, 0.1, 2.0, 0.1): (75.41, 19.92),
    (0.02, 0.1, 5.0, 0.1): (73.22, 18.61), (0.02, 0.1, 1.0, 0.5): (75.56, 20.60), (0.02, 0.1, 1.0, 1.0): (74.20, 19.27),
}


def sgps_ablation_table(runs: pd.DataFrame, params: dict, run_of: dict[str, Run]) -> pd.DataFrame:
    """``figures.sgps_ablations``: one row per trained variant, P@1 / MAP@R (mean, sample SD over seeds), its
    overrides, and Table V's CARS numbers where the variant's (tau, delta, gamma_1, gamma_2) is a row of it."""
    ablations = params["figures"]["sgps_ablations"]
    out = []
    for variant in ablations["train"]:
        group = runs[[run_of[name].point["variant"] == variant for name in runs["method"]]]
        spec = ablations["variants"][variant]
        hp = {**params["methods"]["sgps"], **spec["hparams"]}
        paper = SGPS_TABLE5.get(tuple(float(hp[k]) for k in ("temperature", "margin", "gamma_batch", "gamma_bank")))
        out.append({
            "group": spec["group"], "variant": variant,
            "overrides": ", ".join(f"{k}={v}" for k, v in spec["hparams"].items()) or "(none)",
            "seeds": len(group),
            "P@1": group["precision_at_1"].mean(), "P@1 SD": group["precision_at_1"].std(ddof=1),
            "MAP@R": group["mean_average_precision_at_r"].mean(),
            "MAP@R SD": group["mean_average_precision_at_r"].std(ddof=1),
            "paper P@1 (CARS)": paper[0] / 100 if paper and spec["group"].startswith("Table V") else None,
            "paper MAP@R (CARS)": paper[1] / 100 if paper and spec["group"].startswith("Table V") else None,
        })
    return pd.DataFrame(out)


def _chain_line(c: dict) -> str:
    """One chained run as a Markdown bullet: what it trains, after which run, and what it takes from it."""
    takes = []
    if any(c["init"].values()):
        takes.append(f"its {'/'.join(k for k, v in c['init'].items() if v)} weights")
    if c["labels"]["label"]:
        takes.append(f"its exported labels `{c['labels']['label']}`")
    if c["labels"]["keep"]:
        takes.append(f"only the samples its export `{c['labels']['keep']}` keeps")
    if c["inputs"]:
        takes.append(f"inputs {c['inputs']}")
    return (f"- **{c['name']}** ({c['dataset']}/{c['noise']}, seed {c['seed']}): `{c['method']}` trained after "
            f"`{c['upstream']}`, taking " + ", ".join(takes))


def write_report(params: dict, layout) -> Path:
    from noisydml.evaluation import metric_names
    from noisydml.reporting.references import load_references, reference_section
    from noisydml.reporting.plots import (
        plot_bspml_maps, plot_embedding_size, plot_metric_vs_noise, plot_noise_per_class, plot_selection,
        plot_training_curves, plot_weight_histograms,
    )

    out = layout.reports
    stats = noise_stats(params, layout)
    per_seed = collect(params, layout, stats)
    # the figures' own runs have their own sections, outside the grid's tables
    every_run = per_seed  # results_per_seed.csv: every run, the figures' too (run_kind tells them apart)
    kinds = per_seed["run_kind"] if not per_seed.empty else pd.Series(dtype=str)
    sweep, cell_runs = per_seed[kinds == "embedding_size"], per_seed[kinds == "bspml_cell"]
    ablation_runs = per_seed[kinds == "sgps_ablation"]
    per_seed = per_seed[~kinds.isin(["embedding_size", "bspml_cell", "sgps_ablation"])]
    per_seed = per_seed.drop(columns=[c for c in per_seed.columns if c.startswith("final_bspml_")])
    run_of = {r.name: r for r in runs_of(params) if r.kind != "grid"}  # a figure's runs: their points
    sizes = embedding_size_summary(sweep, run_of)
    cells = bspml_cells_summary(cell_runs, run_of)
    names = [m for m in metric_names(params["evaluate"]["recall_at"]) if m in per_seed.columns]
    summary = summarise(per_seed, names)
    noise = noise_table(stats)
    shown = params["report"]["metrics"]
    selection = selection_summary(per_seed)
    times = timing_table(params, layout)

    clusters = cluster_size_table(stats)
    per_class = {f"{d}/{n}": pd.read_csv(layout.noisy(d, n) / "per_class.csv")
                 for d in params["grid"]["datasets"] for n in noises_of(params["grid"])}
    nominal = {f"{r.dataset}/{r.noise}": r.nominal_rate for r in noise.itertuples()}

    chains = [_chain_line(c) for c in params["chains"].values()]
    md = ["# Results", "", markdown_table(summary, shown, params), ""]
    if chains:
        md += ["Chained runs (params.yaml `chains`; each is a DVC stage that depends on its upstream run):", "",
               *chains, ""]
    md += [
          "![P@1 against noise rate](p_at_1_vs_noise.png)", "",
          "## Noise settings", "",
          "What each setting did to the training labels. Flip rate: share of a class's own images "
          "relabelled; impurity: share of a kept training label's samples that are not of that class.", "",
          noise.to_markdown(index=False), ""]
    if clusters is not None:
        md += ["### Moved clusters (small-cluster noise): number of clusters of each size", "",
               clusters.to_markdown(), ""]
    md += ["![Per-class noise](noise_per_class.png)", ""]
    md += ["## Sample selection", "",
           "Methods that select samples (PRISM): at the final epoch, the share of kept samples that are truly "
           "clean (precision) and of truly clean samples that are kept (recall), from the corrupt stage's "
           "ground truth, mean over seeds. A selection no better than chance has precision = clean fraction.", ""]
    md += [selection.round(4).to_markdown(index=False) if not selection.empty else "(no run in the grid selects samples)",
           "", "![Selection over training](selection_over_training.png)", ""]
    weights = weight_summary(per_seed)
    md += ["## Sample weights", "",
           "Methods that weight samples (BSPML): the final mean weight of truly clean and truly noisy training "
           "samples (ground truth the method never sees), mean over seeds, and their histograms.", "",
           weights.round(4).to_markdown(index=False) if not weights.empty else "(no run in the grid weights samples)",
           "", "![Weights of clean and noisy samples](weights_clean_noisy.png)", ""]
    table1 = bspml_table1(summary, params) if "recall_at_1" in summary else []
    table2 = bspml_table2(summary) if "recall_at_1" in summary else []
    md += ["## BSPML's table layouts", "",
           "Table 1 (clean labels; the paper: CUB, Cars, In-shop, SOP) and Table 2 (Recall@1 under per-class "
           "symmetric noise, `symmetric_per_class`; the paper: 10/20/30% on CUB, Cars, In-shop), our rows for the "
           "methods of the grid. Its MS and BSPML use rho = 1 (`ms_rho1`, `bspml`); `ms` is pml's rho = 0.5.", ""]
    md += table1 or ["(Table 1: no clean-label noise setting in the grid)", ""]
    md += table2 or ["(Table 2: no per-class noise setting in the grid: add sympc10, sympc20, sympc30 to "
                     "grid.noises)", ""]
    md += ["## Embedding size (BSPML Fig. 5)", "", *embedding_size_lines(sizes, params["figures"]["embedding_size"]),
           "![Recall@1 against embedding size](embedding_size.png)", ""]
    md += ["## BSPML retrained per cell (Figs. 3-4)", "", *bspml_cells_lines(cells, params["figures"]["bspml_cells"]),
           "![MAW, SDAW and Recall@1 over (mu, lambda)](bspml_cells.png)", ""]
    sgps_diag = sgps_diagnostics(per_seed)
    posterior = posterior_table(params, per_seed)
    md += ["## SGPS", "",
           "Subgroups and positives at the final epoch (the trainer's scores from ground truth the method never "
           "sees; mean over seeds): purity of the subgroup labellings, the share of truly noisy samples whose "
           "positive candidates hold a sample of their true class (or any sample), and of the rejected samples "
           "(anchors) and their drawn positives.", "",
           sgps_diag.round(4).to_markdown(index=False) if not sgps_diag.empty else "(no SGPS run in the grid)", ""]
    md += ["### Posterior data clean (Sec. IV-E)", "",
           "Stage 1's c^B (a fresh SGM pass on its final model) as stage 2's labels: purity (rows in their "
           "cluster's majority true class) and coverage (rows kept: clusters of one row are left out); then each "
           "stage's P@1, per seed.", "",
           posterior.round(4).to_markdown(index=False) if not posterior.empty else "(no chain trains on cluster labels)", ""]
    md += ["SGPS's Tables I-III beside our runs: see \"The papers' tables beside ours\" below. Its Table I SGPS-MCL "
           "row is its posterior data clean, so it sits beside `sgps_posterior`; its Table II SGPS-MCL is plain `sgps`.",
           ""]
    md += ["![P@1 and MAP@R over training](curves_over_training.png)", ""]
    ablation = sgps_ablation_table(ablation_runs, params, run_of)
    md += ["### SGPS ablations (Fig. 5a, Fig. 5b, Table V)", ""]
    if ablation.empty:
        md += ["(opt-in: list variants in `figures.sgps_ablations.train`; see params.yaml)", ""]
    else:
        abl = params["figures"]["sgps_ablations"]
        md += [f"sgps variants on {abl['dataset']} / {abl['noise']}, P@1 and MAP@R in %, mean and sample SD over "
               "seeds. The paper (CARS and SOP, 50% symmetric noise) reports for Fig. 5a: both > SGM-B only > SGM-T "
               "only; Fig. 5b: TransProto > Mean, SoftMax > Max (figures, no numbers); Table V's CARS numbers are "
               "beside the variants with its settings.", "",
               (ablation.set_index(["group", "variant", "overrides", "seeds"]) * 100).round(2).reset_index()
               .to_markdown(index=False), ""]
    spa = spa_table(params, per_seed)
    md += ["## Smooth Proxy-Anchor", "",
           "Phase 1 (`spa_confidence`, a grid run) trains a confidence module on the noisy labels; phase 2 "
           "(`smooth_proxy_anchor`, a chained run) trains Proxy-Anchor with proxies selected by, and terms weighted "
           "by, phase 1's confidences; both on the frozen backbone, so `proxy_anchor_frozen` is its baseline. The "
           "loss, the smoothing and the relabelling are reconstructions (see the README). Per seed; phase 1: "
           "flagged = top-confidence class != given label (flag precision by chance = the noise rate), AUROC of "
           "the given label's confidence for clean vs noisy samples, relabelling accuracy = top class is the true "
           "class; phase 2: samples positive for no proxy, given labels below tau (dropped). Scores from ground "
           "truth the methods never see.", "",
           spa.round(4).to_markdown(index=False) if not spa.empty else "(no smooth_proxy_anchor chain in params.yaml)",
           "", "![Confidences of clean and noisy samples](spa_confidence_clean_noisy.png)", ""]
    references, status = reference_section(load_references(layout.root / "references" / "papers"), summary, params, stats)
    md += references
    md += ["## Training time", ""]
    if times.empty:
        md += ["(opt-in: list methods under `timing.entries` in params.yaml to time them; see the README)", ""]
    else:
        md += [f"Seconds per epoch on the same data (`timing` in params.yaml: {params['timing']['epochs']} epochs "
               "each, the first not counted), beside PRISM's published training times (Table 4 of the slides, "
               "CARS-98N, BN-Inception on a GPU). Compare the ratios, not the seconds.", "",
               times.to_markdown(index=False), ""]
    inexact = per_seed[~per_seed["map_at_r_exact"].astype(bool)]
    if not inexact.empty:
        md += ["**MAP@R and R-Precision are underestimates** for "
               + ", ".join(f"{r.dataset}/{r.noise}/{r.method}/seed{r.seed}" for r in inexact.itertuples())
               + f": `evaluate.max_k` ({params['evaluate']['max_k']}) is below the largest test class - 1.", ""]
    io.write_text(out / "results.md", "\n".join(md))
    io.write_with(out / "results.csv", lambda p: summary.to_csv(p, index=False, float_format="%.6f"))
    # per-epoch curves live in metrics/*.json
    flat = every_run.drop(columns=[c for c in every_run.columns if c.startswith(("diag_", "histogram_", "curve_"))])
    io.write_with(out / "results_per_seed.csv", lambda p: flat.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "noise_stats.csv", lambda p: noise.to_csv(p, index=False))
    plot_metric_vs_noise(summary, "precision_at_1", out / "p_at_1_vs_noise.png")
    plot_noise_per_class(per_class, nominal, out / "noise_per_class.png")
    plot_selection(per_seed, out / "selection_over_training.png")
    plot_training_curves(per_seed, out / "curves_over_training.png")
    io.write_with(out / "sgps_posterior.csv", lambda p: posterior.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "sgps_ablations.csv", lambda p: ablation.to_csv(p, index=False, float_format="%.6f"))
    plot_weight_histograms(per_seed, out / "weights_clean_noisy.png")
    spa_runs = {c["upstream"] for c in params["chains"].values() if c["method"] == "spa_smooth_loss"} | \
        {c["name"] for c in params["chains"].values() if c["method"] == "spa_smooth_loss"}
    plot_weight_histograms(per_seed[per_seed["method"].isin(spa_runs)] if not per_seed.empty else per_seed,
                           out / "spa_confidence_clean_noisy.png", column="histogram_confidence",
                           xlabel="c(x, given label) (phase 1) / S(c) (phase 2)",
                           empty="no smooth_proxy_anchor chain in params.yaml")
    io.write_with(out / "smooth_proxy_anchor.csv", lambda p: spa.to_csv(p, index=False, float_format="%.6f"))
    fig5 = params["figures"]["embedding_size"]
    plot_embedding_size(sizes, f"Recall@1 against embedding size, {fig5['dataset']} / {fig5['noise']}",
                        out / "embedding_size.png")
    io.write_with(out / "embedding_size.csv", lambda p: sizes.to_csv(p, index=False, float_format="%.6f"))
    plot_bspml_maps(cells, f"BSPML retrained per cell, {params['figures']['bspml_cells']['dataset']} / "
                    f"{params['figures']['bspml_cells']['noise']} (mean over seeds)", out / "bspml_cells.png",
                    columns=("maw", "sdaw", "recall_at_1"))
    io.write_with(out / "bspml_cells.csv", lambda p: cells.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "selection.csv", lambda p: selection.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "paper_status.csv", lambda p: status.to_csv(p, index=False))
    io.write_with(out / "training_time.csv", lambda p: times.to_csv(p, index=False))
    # Plot data for `dvc plots show`: one row per point, methods told apart by the `method` field.
    plot_rows = plot_series(summary)[["dataset", "method", "noise", "noise_kind", "noise_rate", "precision_at_1",
                                      "mean_average_precision_at_r"]]
    io.write_with(out / "plots" / "p_at_1_vs_noise.csv", lambda p: plot_rows.to_csv(p, index=False, float_format="%.6f"))
    combined = {
        f"{r.dataset}/{r.noise}/{r.method}": {m: round(float(getattr(r, m)), 6) for m in names}
        for r in summary.itertuples()
    }
    figure_runs = pd.concat([sweep, cell_runs, ablation_runs])
    fig5_rows = figure_runs.groupby(["dataset", "noise", "method"], sort=False)[names].mean().reset_index() \
        if not figure_runs.empty else figure_runs
    combined.update({f"{r.dataset}/{r.noise}/{r.method}": {m: round(float(getattr(r, m)), 6) for m in names}
                     for r in fig5_rows.itertuples()})
    io.write_json(out / "metrics.json", combined)
    print((out / "results.md").read_text())
    return out
