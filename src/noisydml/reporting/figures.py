"""The report's own figures (the report stage alone imports this module, so changing a figure re-runs only the
report): faceted so that no panel draws more than :data:`MAX_LINES` lines, legends outside the data, PDF beside
PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.reporting.names import NOISE_MODELS
from noisydml.reporting.plots import _save, plt

#: Lines one panel draws at most: more, and colours repeat and the legend hides the data.
MAX_LINES = 8


def panels(runs: list[str], groups: dict[str, list[str]], most: int = MAX_LINES) -> list[tuple[str, list[str]]]:
    """``runs`` split into titled panels: one per group of ``groups`` (``report.panels``) that holds any, then
    ``other`` for the rest, each in ``runs``' order and cut into panels of at most ``most`` runs."""
    placed = [(title, [r for r in runs if r in members]) for title, members in groups.items()]
    listed = {r for _, members in placed for r in members}
    placed.append(("other", [r for r in runs if r not in listed]))
    out = []
    for title, members in placed:
        parts = -(-len(members) // most)  # as few panels as the cap allows, filled evenly (9 -> 5 + 4, not 8 + 1)
        chunks = [members[k * len(members) // parts:(k + 1) * len(members) // parts] for k in range(parts)]
        out += [(title if parts == 1 else f"{title} ({k + 1}/{parts})", chunk) for k, chunk in enumerate(chunks)]
    return out


def _unique_handles(axes) -> tuple[list, list[str]]:
    """The legend entries of every panel of ``axes``, each name once, in drawing order."""
    handles, names = [], []
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    return handles, names


def _row_legend(axes) -> None:
    """One legend for a row of panels (every run any of them draws, once), outside the last one."""
    handles, names = _unique_handles(axes)
    if handles:
        axes[-1].legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
                        frameon=False)


#: Points of one noise setting spread side by side over this share of a category's width, so error bars do not
#: overlap (the axis is categorical: an offset cannot be read as a rate).
DODGE = 0.5
#: A run's line is drawn only through at least this many measured rates; with fewer, its points stand alone (a line
#: between two rates would draw a curve nobody measured).
LINE_FROM = 3


def run_styles(runs: list[str]) -> dict[str, dict]:
    """One colour (and marker) per run, the same in every panel and figure: tab10's colours, then tab20's light
    ones, each round of 20 with its own marker."""
    palette = [plt.get_cmap("tab10")(i) for i in range(10)] + [plt.get_cmap("tab20")(2 * i + 1) for i in range(10)]
    markers = "osD^v<>ph*"
    return {run: {"color": palette[i % len(palette)], "marker": markers[(i // len(palette)) % len(markers)]}
            for i, run in enumerate(runs)}


def noise_points(points: pd.DataFrame, metric: str, groups: dict[str, list[str]], labels: dict[str, str],
                 kind_names: dict[str, str] | None = None) -> pd.DataFrame:
    """What the metric-against-noise figure draws, one row per point, and what ``dvc plots show`` draws
    (``reports/plots/p_at_1_vs_noise.csv``): the figure row (``dataset, panel``), the noise kind's name, the run
    and its label (the papers' naming), the setting, the rate and ``metric`` with its sample sd over seeds in %,
    and ``joined`` (1 where the run's points are a line: :data:`LINE_FROM` rates or more).

    ``points`` has columns dataset, method, noise, noise_kind, noise_rate, seeds, ``metric`` and ``metric``_std;
    clean labels (kind ``none``) are the rate-0 point of every kind's line (:func:`noisydml.reporting.tables.
    plot_series`)."""
    kind_names = kind_names or NOISE_MODELS
    kinds = [k for k in dict.fromkeys(points["noise_kind"]) if k != "none"] or ["none"]
    rows = []
    for dataset in dict.fromkeys(points["dataset"]):
        of_dataset = points[points["dataset"] == dataset]
        for title, runs in panels(list(dict.fromkeys(of_dataset["method"])), groups):
            for run in runs:
                for kind in kinds:
                    line = of_dataset[(of_dataset["method"] == run)
                                      & of_dataset["noise_kind"].isin({kind, "none"})].sort_values("noise_rate")
                    joined = int(line["noise_rate"].nunique() >= LINE_FROM)
                    sd = line[f"{metric}_std"] if f"{metric}_std" in line else pd.Series(np.nan, index=line.index)
                    for r, spread in zip(line.itertuples(), sd):
                        rows.append({"row": f"{dataset}, {title}", "dataset": dataset, "panel": title,
                                     "noise_kind": kind_names.get(kind, kind.replace("_", " ")), "run": run,
                                     "method": labels.get(run, run), "noise": r.noise,
                                     "noise_rate": round(100 * float(r.noise_rate), 4),
                                     metric: 100 * float(getattr(r, metric)),
                                     f"{metric}_sd": 100 * float(spread) if pd.notna(spread) else np.nan,
                                     "seeds": int(getattr(r, "seeds", 1)), "joined": joined})
    return pd.DataFrame(rows, columns=["row", "dataset", "panel", "noise_kind", "run", "method", "noise",
                                       "noise_rate", metric, f"{metric}_sd", "seeds", "joined"])


def plot_metric_vs_noise(drawn: pd.DataFrame, metric: str, path: Path, head: str,
                         styles: dict[str, dict] | None = None) -> None:
    """``metric`` (%, called ``head``) against the noise setting, mean ± sample sd over seeds as error bars, from
    :func:`noise_points`: one row of panels per (dataset, group of runs), one column per noise kind, one y scale and
    one colour per run across every panel (:func:`run_styles`), the row's legend outside its last panel. The axis is categorical
    (one place per measured rate, evenly spaced, labelled with the rate): the points of one setting sit side by
    side (:data:`DODGE`) and no offset reads as a rate. A run's points are joined by a line only where at least
    :data:`LINE_FROM` rates were measured.
    """
    layout = list(dict.fromkeys(drawn["row"]))
    kinds = list(dict.fromkeys(drawn["noise_kind"]))
    styles = styles or run_styles(list(dict.fromkeys(drawn["run"])))
    # one y scale for every panel: a method and its baseline in different rows are read on the same scale
    fig, axes = plt.subplots(len(layout), len(kinds), figsize=(4.2 * len(kinds) + 2.8, 3.0 * len(layout)),
                             squeeze=False, sharey=True, layout="constrained")
    seeds = sorted(set(drawn["seeds"].astype(int))) if len(drawn) else [1]
    rates = sorted(drawn["noise_rate"].unique())
    position = {r: float(i) for i, r in enumerate(rates)}
    for row, row_axes in zip(layout, axes):
        of_row = drawn[drawn["row"] == row]
        runs = list(dict.fromkeys(of_row["run"]))
        for ax, kind in zip(row_axes, kinds):
            n = 0
            for i, run in enumerate(runs):
                line = of_row[(of_row["run"] == run) & (of_row["noise_kind"] == kind)]
                if line.empty:
                    continue
                shift = (i - (len(runs) - 1) / 2) * DODGE / max(len(runs) - 1, 1)
                ax.errorbar([position[r] + shift for r in line["noise_rate"]], line[metric],
                            yerr=line[f"{metric}_sd"].fillna(0), linestyle="-" if line["joined"].iloc[0] else "none",
                            markersize=4, capsize=3, label=line["method"].iloc[0], **styles[run])
                n += 1
            ax.set_title(f"{row}" + (f": {kind} noise" if kind != "none" else ""), fontsize=9)
            ax.set_xlim(-0.5, len(rates) - 0.5)
            for i in range(1, len(rates), 2):  # every other setting's band shaded: a point belongs to its band
                ax.axvspan(i - 0.5, i + 0.5, color="0.94", zorder=0)
            ax.set_xticks([position[r] for r in rates], [f"{r:g}%" for r in rates])
            ax.set_xlabel("noise rate (evenly spaced settings)")
            ax.grid(alpha=0.3)
            if not n:
                ax.text(0.5, 0.5, f"no run of this panel\nunder {kind} noise", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="grey")
        row_axes[0].set_ylabel(f"{head} (%)")
        _row_legend(row_axes)
    n = "/".join(map(str, seeds))
    spread_text = f"sample sd over n = {n} seeds" if seeds != [1] else "none (one seed: no ordering is claimed)"
    fig.suptitle(f"{head} against the noise rate\nerror bars: {spread_text}; lines join runs measured at "
                 f"{LINE_FROM} or more rates, side by side at each", fontsize=10)
    _save(fig, path, vector=True)


def plot_selection(per_seed: pd.DataFrame, path: Path, labels: dict[str, str] | None = None,
                   styles: dict[str, dict] | None = None, noise_names: dict[str, str] | None = None) -> None:
    """Selection precision (solid) and recall (dashed) per epoch, mean over seeds: one panel per (dataset, noise
    setting), one colour per run (at most :data:`MAX_LINES` runs a panel), the legend outside; dotted: the clean
    fraction of the labels (what a selection no better than chance reaches)."""
    from matplotlib.lines import Line2D

    labels, noise_names = labels or {}, noise_names or {}
    rows = per_seed.dropna(subset=["diag_selection_precision"]) if "diag_selection_precision" in per_seed else per_seed.iloc[:0]
    settings = []  # (dataset, noise, runs of one panel)
    for (dataset, noise), group in rows.groupby(["dataset", "noise"], sort=False):
        settings += [(dataset, noise, runs) for _, runs in panels(list(dict.fromkeys(group["method"])), {})]
    fig, axes = plt.subplots(1, max(1, len(settings)), figsize=(4.4 * max(1, len(settings)) + 2.4, 3.6),
                             squeeze=False, sharey=True, layout="constrained")
    if not settings:
        axes[0, 0].text(0.5, 0.5, "no run in the grid selects samples", ha="center", va="center")
        axes[0, 0].set_axis_off()
    styles = styles or run_styles(list(dict.fromkeys(rows["method"])))
    for ax, (dataset, noise, runs) in zip(axes[0], settings):
        group = rows[(rows["dataset"] == dataset) & (rows["noise"] == noise)]
        for run in runs:
            of_run = group[group["method"] == run]
            for column, style in (("diag_selection_precision", "-"), ("diag_selection_recall", "--")):
                curves = np.array([[np.nan if v is None else v for v in c] for c in of_run[column]], dtype=float)
                mean = np.nanmean(curves, axis=0)
                ax.plot(np.arange(1, len(mean) + 1), 100 * mean, style, color=styles[run]["color"],
                        marker=styles[run]["marker"], markersize=3,
                        label=labels.get(run, run) if style == "-" else None)
        ax.axhline(100 * (1 - group["actual_noise_rate"].iloc[0]), color="k", linestyle=":", linewidth=1)
        ax.set_title(f"{dataset}, {noise_names.get((dataset, noise), noise)}", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylim(0, 102)
        ax.grid(alpha=0.3)
    if settings:
        axes[0, 0].set_ylabel("share of samples (%)")
        handles, names = _unique_handles(axes[0])
        handles += [Line2D([], [], color="grey", linestyle="-"), Line2D([], [], color="grey", linestyle="--"),
                    Line2D([], [], color="k", linestyle=":")]
        names += ["precision (kept that are clean)", "recall (clean that are kept)", "clean fraction (chance)"]
        fig.legend(handles, names, fontsize=7, loc="outside right center", frameon=False)
        fig.suptitle("sample selection over training (the trainer's scores from ground truth)", fontsize=10)
    _save(fig, path, vector=True)
