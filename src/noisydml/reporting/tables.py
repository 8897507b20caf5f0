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
from noisydml.sections.grid import noises_of
from noisydml.reporting.names import DASH, DIGITS, metric_name, named_table, percent
from noisydml.runs import Run


#: The highest test P@1 over the monitored epochs (every ``train.eval_every`` epochs and the last): the figure a
#: trainer that keeps its best test epoch reports (the PRISM authors' code, every 100 iterations). Test-selected, so
#: only ever shown labelled as such beside our protocol's number.
BEST_ON_TEST = "best_on_test_precision_at_1"


def collect(runs: list[Run], layout, stats: dict[tuple[str, str], dict]) -> pd.DataFrame:
    """One row per run and seed: its metrics (the evaluate stage's), the trainer's scores of its decisions, and for
    a study's own runs the values its method logged last (``final_<name>``)."""
    rows = []
    for run in runs:
        dataset, noise, method, seed, kind = run.dataset, run.noise, run.name, run.seed, run.kind.name
        path = layout.metrics(dataset, noise, method, seed)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run `dvc repro` to evaluate every run of the grid")
        result = io.read_json(path)
        setting = stats[dataset, noise]
        training = result.get("training", {})
        curve = [v for key in ("curve_test_precision_at_1", "curve_test_check_precision_at_1")
                 for v in training.get(key, []) if v is not None]
        rows.append({
            "dataset": dataset, "noise": noise, "noise_kind": setting["kind"],
            "noise_rate": setting["nominal_rate"], "actual_noise_rate": setting["actual_rate"],
            "method": method, "run_kind": kind, "seed": seed, **result["metrics"],
            # test-selected: the best monitored test P@1, per epoch and with train.test_check_every_steps every N
            # steps (what the PRISM authors' code reports); never a headline
            BEST_ON_TEST: max(curve) if curve else float("nan"),
            "map_at_r_exact": result.get("map_at_r_exact", True), "k_used": result.get("k_used"),
            # per test class: queries and hits at P@1 (the orderings' bootstrap over classes)
            "per_class_precision_at_1": result.get("per_class_precision_at_1"),
            # the reported epoch (the last, the best on validation classes, or the method's own pick)
            "selected_epoch": result.get("selected_epoch"),
            **{f"pseudo_label_{k}": v for k, v in result.get("pseudo_labels", {}).items()},
            # the trainer's scores of the method's decisions: per-epoch lists and final values
            **{k: v for k, v in training.items() if k.startswith(("diag_", "final_diag_", "histogram_", "curve_"))},
            **{f"final_{k}": v for k, v in training.get("final_logged", {}).items() if kind not in ("grid", "chain")},
        })
    return pd.DataFrame(rows)


#: Scores of sample selection (the trainer's ``diag_*`` of a method's keep decisions).
SELECTION_COLUMNS = ("diag_selection_precision", "diag_selection_recall", "diag_kept_fraction")

#: Face verification metrics (the evaluate stage's, for datasets with verification sets), as the report heads them:
#: 10-fold accuracy of each .bin set, TAR at FAR on the template pairs; all in %.
VERIFICATION_METRICS = {"lfw_accuracy": "LFW-like acc.", "cfp_fp_accuracy": "CFP-FP-like acc.",
                        "agedb_30_accuracy": "AgeDB-like acc.", "tar_at_far_0.001": "TAR@FAR 1e-3",
                        "tar_at_far_0.0001": "TAR@FAR 1e-4", "tar_at_far_1e-05": "TAR@FAR 1e-5"}


def verification_markdown(summary: pd.DataFrame, run_labels: dict[str, str],
                          noise_names: dict[tuple[str, str], str]) -> list[str]:
    """The face runs' verification numbers beside their P@1 (mean +- std over seeds, %), or nothing when no run
    has them; the false accepts the lowest FAR rests on under the table."""
    columns = [c for c in VERIFICATION_METRICS if c in summary.columns]
    if not columns:
        return []
    rows = summary[summary[columns].notna().any(axis=1)]
    shown = named_table(rows[["dataset", "noise", "method", "seeds"]], run_labels, noise_names)

    def cell(mean, std, scale):
        if pd.isna(mean):
            return DASH
        return f"{scale * mean:.{DIGITS}f}" + ("" if pd.isna(std) else f" ± {scale * std:.{DIGITS}f}")

    shown["P@1"] = [cell(m, s, 100) for m, s in zip(rows["precision_at_1"], rows["precision_at_1_std"])]
    for column in columns:
        shown[VERIFICATION_METRICS[column]] = [cell(m, s, 1) for m, s in zip(rows[column], rows[f"{column}_std"])]
    lines = ["## Face verification", "",
             "Runs on datasets with verification sets: the 10-fold accuracy of each pair set (image + flipped image, "
             "threshold chosen on nine folds) and TAR at FAR on the template pairs, beside P@1 on the test "
             "identities; mean ± standard deviation over seeds, in %.", "",
             shown.rename(columns={"noise": "noise setting"}).to_markdown(index=False, disable_numparse=True), ""]
    fa = "tar_at_far_1e-05_false_accepts"
    if fa in summary.columns and rows[fa].notna().any():
        lines += [f"TAR at FAR 1e-5 rests on {int(rows[fa].min())} false accepts per run (per-seed values and "
                  "intervals: results_per_seed.csv).", ""]
    low, high = "tar_at_far_1e-05_identities_low", "tar_at_far_1e-05_identities_high"
    if low in summary.columns and rows[low].notna().any():
        # records, not itertuples: a column named tar_at_far_1e-05_... is no attribute name
        spans = ", ".join(f"{run_labels.get(r['method'], r['method'])} [{r[low]:.{DIGITS}f}, {r[high]:.{DIGITS}f}]"
                          for r in rows.to_dict("records") if pd.notna(r[low]))
        lines += ["TAR at FAR 1e-5, 95% interval over a bootstrap of the test identities (whole identities "
                  "resampled with every pair they enter; a Wilson interval over pairs is narrower and wrong, pairs "
                  f"of one identity are not independent), mean over seeds of each end: {spans}.", ""]
    return lines


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


def timing_results(params: dict, layout) -> list[dict]:
    """The ``timing`` stage's result of every entry of ``timing.entries``, in order."""
    results = []
    for entry in params["timing"]["entries"]:
        path = layout.timing(entry)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run `dvc repro timing@{entry}`")
        results.append(io.read_json(path))
    return results


def timing_table(results: list[dict]) -> pd.DataFrame:
    """Seconds per epoch and per step of the timed entries, and their ratio to the first entry's."""
    first = results[0] if results else None
    columns = ["dataset", "noise", "method", "seconds/epoch", "ms/step", "x first row"]
    return pd.DataFrame(columns=columns) if not results else pd.DataFrame([{
        "dataset": r["dataset"], "noise": r["noise"], "method": r["label"],
        "seconds/epoch": round(r["seconds_per_epoch"], 2), "ms/step": round(1e3 * r["seconds_per_step"], 1),
        "x first row": round(r["seconds_per_epoch"] / first["seconds_per_epoch"], 2),
    } for r in results])


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


def weight_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Final-epoch mean weight of truly clean and truly noisy samples of runs that weight samples."""
    columns = ["final_diag_weight_clean", "final_diag_weight_noisy"]
    if not set(columns) <= set(per_seed.columns):
        return pd.DataFrame()
    groups = per_seed.dropna(subset=columns).groupby(["dataset", "noise", "method"], sort=False)
    table = groups[columns].mean().rename(columns={"final_diag_weight_clean": "mean weight, clean",
                                                   "final_diag_weight_noisy": "mean weight, noisy"})
    table["seeds"] = groups.size()
    return table.reset_index()


def _chain_line(c: dict, labels: dict[str, str] | None = None,
                noise_names: dict[tuple[str, str], str] | None = None) -> str:
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
    labels, noise_names = labels or {}, noise_names or {}
    setting = noise_names.get((c["dataset"], c["noise"]), c["noise"])
    return (f"- **{labels.get(c['name'], c['name'])}** (`{c['name']}`; {c['dataset']}, {setting}, "
            f"seed{'s' * (len(c['seeds']) > 1)} "
            f"{', '.join(map(str, c['seeds']))}): `{c['method']}` trained after "
            f"`{c['upstream']}`, taking " + ", ".join(takes))


def noise_markdown(noise: pd.DataFrame, noise_names: dict[tuple[str, str], str]) -> str:
    """The noise table as results.md shows it: settings by name, rates and shares in %."""
    shown = named_table(noise, {}, noise_names).drop(columns=["kind"])
    shown["nominal_rate"] = [percent(v, 1) for v in noise["nominal_rate"]]
    shown["actual_rate"] = [percent(v, DIGITS) for v in noise["actual_rate"]]
    for column in ("class_flip_rate (min/mean/max)", "class_impurity (min/mean/max)"):
        shown[column] = [_percent_range(v) for v in noise[column]]
    shown = shown.rename(columns={"noise": "noise setting", "nominal_rate": "nominal rate %",
                                  "actual_rate": "actual rate %", "classes_before": "classes before",
                                  "classes_after": "classes after", "dissolved_classes": "dissolved classes",
                                  "moved_clusters": "moved clusters", "cluster_size (mean/max)": "cluster size (mean/max)",
                                  "class_flip_rate (min/mean/max)": "class flip rate % (min/mean/max)",
                                  "class_impurity (min/mean/max)": "class impurity % (min/mean/max)",
                                  "verified_noisy/verified": "verified noisy / verified"})
    return shown.replace("-", DASH).to_markdown(index=False, disable_numparse=True)


def _percent_range(text: str) -> str:
    """``0.00 / 0.50 / 1.00`` (shares) -> ``0.0 / 50.0 / 100.0`` (%)."""
    if text in ("-", DASH):
        return DASH
    return " / ".join(f"{100 * float(v):.1f}" for v in text.split(" / "))


def shares_markdown(table: pd.DataFrame, columns: list[str], run_labels: dict[str, str],
                    noise_names: dict[tuple[str, str], str], digits: int = DIGITS, as_percent: bool = True) -> str:
    """A table of shares (selection scores, clean fraction) or weights with methods and settings named, every
    value of ``columns`` in % (``as_percent``) or as a number, all with ``digits`` decimals; a dash for none."""
    shown = named_table(table, run_labels, noise_names)
    for column in columns:
        shown[column] = [percent(v, digits) if as_percent else (DASH if pd.isna(v) else f"{v:.{digits}f}")
                         for v in table[column]]
    heads = {c: metric_name(c) + (" %" if as_percent else "") for c in columns}
    return shown.rename(columns={**heads, "noise": "noise setting"}).to_markdown(index=False, disable_numparse=True)
