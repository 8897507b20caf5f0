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


def collect(params: dict, layout) -> pd.DataFrame:
    grid = params["grid"]
    rows = []
    for dataset, noise, method, seed in itertools.product(grid["datasets"], grid["noises"], grid["methods"], grid["seeds"]):
        path = layout.metrics(dataset, noise, method, seed)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run `dvc repro` to evaluate every run of the grid")
        result = io.read_json(path)
        stats = io.read_json(layout.noisy(dataset, noise) / "stats.json")
        rows.append({
            "dataset": dataset, "noise": noise, "noise_kind": stats["kind"],
            "noise_rate": stats["nominal_rate"], "actual_noise_rate": stats["actual_rate"],
            "method": method, "seed": seed, **result["metrics"],
        })
    return pd.DataFrame(rows)


def summarise(per_seed: pd.DataFrame, metric_names: list[str]) -> pd.DataFrame:
    """Mean and standard deviation over seeds of every metric, one row per (dataset, noise, method)."""
    keys = ["dataset", "noise", "noise_kind", "noise_rate", "actual_noise_rate", "method"]
    grouped = per_seed.groupby(keys, sort=False)[metric_names]
    mean = grouped.mean()
    std = grouped.std(ddof=0).add_suffix("_std")
    out = pd.concat([mean, std], axis=1).reset_index()
    out.insert(len(keys), "seeds", grouped.size().to_numpy())
    return out


def markdown_table(summary: pd.DataFrame, metrics: list[str], params: dict) -> str:
    """Rows = methods, columns = dataset x noise, cells = the chosen metrics in percent."""
    short = {"precision_at_1": "P@1", "mean_average_precision_at_r": "MAP@R", "r_precision": "RP", "nmi": "NMI"}
    short.update({f"recall_at_{k}": f"R@{k}" for k in params["evaluate"]["recall_at"]})
    grid = params["grid"]
    columns = [(d, n) for d in grid["datasets"] for n in grid["noises"]]
    header = "| method | " + " | ".join(f"{d} / {n}" for d, n in columns) + " |"
    lines = [
        f"Cells: {' / '.join(short.get(m, m) for m in metrics)} in %, mean over {len(grid['seeds'])} seed(s)"
        + (" (± std)" if len(grid["seeds"]) > 1 else "") + "; final epoch, no test-set model selection.",
        "",
        header,
        "|" + "---|" * (len(columns) + 1),
    ]
    indexed = summary.set_index(["dataset", "noise", "method"])
    for method in grid["methods"]:
        cells = []
        for d, n in columns:
            row = indexed.loc[(d, n, method)]
            parts = []
            for m in metrics:
                text = f"{100 * row[m]:.1f}"
                if row["seeds"] > 1:
                    text += f"±{100 * row[m + '_std']:.1f}"
                parts.append(text)
            cells.append(" / ".join(parts))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def noise_table(params: dict, layout) -> pd.DataFrame:
    rows = []
    for dataset in params["grid"]["datasets"]:
        for noise in params["grid"]["noises"]:
            s = io.read_json(layout.noisy(dataset, noise) / "stats.json")
            rows.append({
                "dataset": dataset, "noise": noise, "kind": s["kind"], "nominal_rate": s["nominal_rate"],
                "actual_rate": round(s["actual_rate"], 4), "samples": s["num_samples"], "noisy": s["num_noisy"],
                "classes_before": s["num_classes_before"], "classes_after": s["num_classes_after"],
                "min_class_flip_rate": round(s["flip_rate_per_class"]["min"], 4),
                "max_class_flip_rate": round(s["flip_rate_per_class"]["max"], 4),
            })
    return pd.DataFrame(rows)


def write_report(params: dict, layout) -> Path:
    from noisydml.evaluation.retrieval import metric_names
    from noisydml.reporting.plots import plot_metric_vs_noise

    out = layout.reports
    per_seed = collect(params, layout)
    names = [m for m in metric_names(params["evaluate"]["recall_at"]) if m in per_seed.columns]
    summary = summarise(per_seed, names)
    noise = noise_table(params, layout)
    shown = params["report"]["metrics"]

    md = ["# Results", "", markdown_table(summary, shown, params), "", "## Noise settings", "",
          noise.to_markdown(index=False), "",
          "![P@1 against noise rate](p_at_1_vs_noise.png)", ""]
    io.write_text(out / "results.md", "\n".join(md))
    io.write_with(out / "results.csv", lambda p: summary.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "results_per_seed.csv", lambda p: per_seed.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(out / "noise_stats.csv", lambda p: noise.to_csv(p, index=False))
    plot_metric_vs_noise(summary, "precision_at_1", out / "p_at_1_vs_noise.png")
    # Plot data for `dvc plots show`: one row per point, methods told apart by the `method` field.
    plot_rows = summary[["dataset", "method", "noise", "noise_kind", "noise_rate", "precision_at_1", "mean_average_precision_at_r"]]
    io.write_with(out / "plots" / "p_at_1_vs_noise.csv", lambda p: plot_rows.to_csv(p, index=False, float_format="%.6f"))
    combined = {
        f"{r.dataset}/{r.noise}/{r.method}": {m: round(float(getattr(r, m)), 6) for m in names}
        for r in summary.itertuples()
    }
    io.write_json(out / "metrics.json", combined)
    print((out / "results.md").read_text())
    return out
