"""Plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _save(fig, path: Path) -> None:
    from noisydml import io

    io.write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(fig)


def plot_history(history: pd.DataFrame, title: str, path: Path) -> None:
    """Training loss and monitored test P@1 / MAP@R per epoch."""
    fig, ax_loss = plt.subplots(figsize=(6, 3.5))
    ax_loss.plot(history["epoch"], history["loss"], "o-", color="tab:red", label="train loss")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss", color="tab:red")
    monitored = [c for c in ("test_precision_at_1", "test_mean_average_precision_at_r") if c in history]
    if monitored:
        ax = ax_loss.twinx()
        for col, style in zip(monitored, ("s-", "^--")):
            rows = history.dropna(subset=[col])
            ax.plot(rows["epoch"], rows[col], style, label=col.removeprefix("test_"))
        ax.set_ylabel("test metric (monitoring only)")
        ax.legend(loc="lower right", fontsize=8)
    ax_loss.set_title(title)
    _save(fig, path)


def plot_metric_vs_noise(points: pd.DataFrame, metric: str, path: Path) -> None:
    """One panel per dataset; one line per (method, noise kind) of ``metric`` against the noise rate.

    ``points`` has columns dataset, method, noise_kind, noise_rate, ``metric`` and ``metric``_std.
    Clean labels (kind ``none``) are the rate-0 point of every kind's line.
    """
    datasets = list(dict.fromkeys(points["dataset"]))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        rows = points[points["dataset"] == dataset]
        kinds = [k for k in dict.fromkeys(rows["noise_kind"]) if k != "none"] or ["none"]
        for i, method in enumerate(dict.fromkeys(rows["method"])):
            for kind, style in zip(kinds, ("o-", "s--", "^:", "d-.")):
                line = rows[(rows["method"] == method) & rows["noise_kind"].isin({kind, "none"})].sort_values("noise_rate")
                label = method if len(kinds) == 1 else f"{method} ({kind})"
                ax.errorbar(line["noise_rate"], line[metric], yerr=line.get(f"{metric}_std"), fmt=style, capsize=3,
                            color=f"C{i % 10}", label=label)
        ax.set_title(dataset)
        ax.set_xlabel("noise rate")
        ax.set_ylabel(metric.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_noise_per_class(tables: dict[str, pd.DataFrame], nominal: dict[str, float], path: Path) -> None:
    """Per noise setting: histograms over classes of the impurity (share of a training label's samples
    that are not of that class) and of the flip-out rate (share of a class's own images relabelled).

    ``tables`` maps a title (``dataset/noise``) to its ``per_class.csv``.
    """
    import numpy as np

    n = len(tables)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    bins = np.linspace(0, 1, 21)
    for ax, (title, table) in zip(axes.ravel(), tables.items()):
        impurity = table.loc[table["label"] >= 0, "impurity"].dropna()
        flip_out = table.loc[table["images"] > 0, "flip_out_rate"].dropna()
        ax.hist(impurity, bins=bins, alpha=0.6, label=f"impurity ({len(impurity)} classes kept)")
        ax.hist(flip_out, bins=bins, histtype="step", linewidth=1.5, label=f"flip-out ({len(flip_out)} classes)")
        ax.axvline(nominal[title], color="k", linestyle=":", linewidth=1, label="nominal rate")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("share of wrong labels")
        ax.set_ylabel("classes")
        ax.legend(fontsize=7)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    _save(fig, path)


def plot_selection(per_seed: pd.DataFrame, path: Path) -> None:
    """Selection precision (solid) and recall (dashed) per epoch, mean over seeds, one colour per run group."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    rows = per_seed.dropna(subset=["diag_selection_precision"]) if "diag_selection_precision" in per_seed else per_seed.iloc[:0]
    if rows.empty:
        ax.text(0.5, 0.5, "no run in the grid selects samples", ha="center", va="center")
        ax.set_axis_off()
    for i, ((dataset, noise, method), group) in enumerate(rows.groupby(["dataset", "noise", "method"], sort=False)):
        for column, style in (("diag_selection_precision", "-"), ("diag_selection_recall", "--")):
            curves = np.array([[np.nan if v is None else v for v in c] for c in group[column]], dtype=float)
            mean = np.nanmean(curves, axis=0)
            epochs = np.arange(1, len(mean) + 1)
            label = f"{method} {dataset}/{noise} {column.split('_')[-1]}"
            ax.plot(epochs, mean, style, color=f"C{i % 10}", marker="o", markersize=3, label=label)
        clean = 1 - group["actual_noise_rate"].iloc[0]
        ax.axhline(clean, color=f"C{i % 10}", linestyle=":", linewidth=1)
    if not rows.empty:
        ax.set_xlabel("epoch")
        ax.set_ylabel("share (dotted: clean fraction of the labels)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title("sample selection: precision (solid), recall (dashed)")
    _save(fig, path)


def plot_weight_histograms(per_seed: pd.DataFrame, path: Path, column: str = "histogram_weights",
                           xlabel: str = "final weight", empty: str = "no run in the grid weights samples") -> None:
    """Final sample weights (or another per-sample decision's ``histogram_*``) of truly clean vs truly noisy
    samples, one panel per (dataset, noise, method), the seeds' histograms added up (the trainer's, from ground
    truth)."""
    import numpy as np

    rows = per_seed.dropna(subset=[column]) if column in per_seed else per_seed.iloc[:0]
    groups = list(rows.groupby(["dataset", "noise", "method"], sort=False)) if not rows.empty else []
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(3.2 * max(1, len(groups)), 3), squeeze=False)
    if not groups:
        axes[0, 0].text(0.5, 0.5, empty, ha="center", va="center")
        axes[0, 0].set_axis_off()
    for i, (ax, ((dataset, noise, method), group)) in enumerate(zip(axes[0], groups)):
        edges = np.asarray(group[column].iloc[0]["edges"])
        width = np.diff(edges)
        for kind, colour in (("clean", "C0"), ("noisy", "C3")):
            counts = np.sum([h[kind] for h in group[column]], axis=0).astype(float)
            share = counts / counts.sum() if counts.sum() else counts
            ax.bar(edges[:-1], share, width=width, align="edge", alpha=0.55, color=colour, label=kind)
        ax.set_title(f"{method} {dataset}/{noise}", fontsize=8)
        ax.set_xlabel(xlabel, fontsize=8)
        if i == 0:
            ax.set_ylabel("share of the group")
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_grid_maps(table: pd.DataFrame, title: str, path: Path, columns: tuple[str, ...] = ("maw", "sdaw"),
                   empty: str = "no cells") -> None:
    """``columns`` of ``table`` as heatmaps over its ``lambda`` (x) and ``mu`` (y) columns, values written in the
    cells (e.g. a weight step's MAW and SDAW over its age and balance)."""
    fig, axes = plt.subplots(1, len(columns), figsize=(4.8 * len(columns), 3.8), squeeze=False, layout="constrained")
    axes = axes[0]
    if table.empty:
        for ax in axes:
            ax.set_axis_off()
        axes[0].text(0.5, 0.5, empty, ha="center", va="center")
        _save(fig, path)
        return
    for ax, column in zip(axes, columns):
        grid = table.pivot(index="mu", columns="lambda", values=column)
        image = ax.imshow(grid.to_numpy(), origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(grid.columns)), [f"{v:g}" for v in grid.columns])
        ax.set_yticks(range(len(grid.index)), [f"{v:g}" for v in grid.index])
        ax.set_xlabel("lambda (age)")
        ax.set_ylabel("mu (balance)")
        ax.set_title({"recall_at_1": "R@1"}.get(column, column.upper()))
        for (i, j), value in np.ndenumerate(grid.to_numpy()):
            ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(image, ax=ax)
    fig.suptitle(title, fontsize=8)
    _save(fig, path)


def plot_embedding_size(table: pd.DataFrame, title: str, path: Path, empty: str = "no runs") -> None:
    """Recall@1 (%) against the embedding size, one line per method, error bars = sample SD over seeds. ``table``
    has columns method, embedding_dim, recall_at_1, recall_at_1_std (fractions)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    if table.empty:
        ax.text(0.5, 0.5, empty, ha="center", va="center")
        ax.set_axis_off()
    for method, rows in table.groupby("method", sort=False):
        rows = rows.sort_values("embedding_dim")
        ax.errorbar(rows["embedding_dim"], 100 * rows["recall_at_1"], yerr=100 * rows["recall_at_1_std"].fillna(0),
                    marker="o", capsize=3, label=method)
    if not table.empty:
        ax.set_xscale("log", base=2)
        dims = sorted(table["embedding_dim"].unique())
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.set_xlabel("embedding size")
        ax.set_ylabel("Recall@1 (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
    _save(fig, path)


def plot_training_curves(per_seed: pd.DataFrame, path: Path, methods: tuple[str, ...], solid: tuple[str, ...] = (),
                         title: str = "", empty: str = "no such run in the grid") -> None:
    """Test P@1 and MAP@R over training (monitoring passes every ``train.eval_every`` epochs), mean over seeds,
    one line per (method, noise) of ``methods``: solid for the names starting with one of ``solid``, dashed else."""
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    column = "curve_test_precision_at_1"
    rows = per_seed[per_seed["method"].isin(methods)] if column in per_seed else per_seed.iloc[:0]
    for ax, metric, name in zip(axes, ("precision_at_1", "mean_average_precision_at_r"), ("P@1", "MAP@R")):
        if rows.empty:
            ax.text(0.5, 0.5, empty, ha="center", va="center")
            ax.set_axis_off()
            continue
        for i, ((dataset, noise, method), group) in enumerate(rows.groupby(["dataset", "noise", "method"], sort=False)):
            curves = np.array([[np.nan if v is None else v for v in c] for c in group[f"curve_test_{metric}"]], float)
            mean = np.nanmean(curves, axis=0)
            epochs = np.arange(1, len(mean) + 1)
            shown = np.isfinite(mean)
            ax.plot(epochs[shown], mean[shown], marker="o", markersize=3, color=f"C{i % 10}",
                    linestyle="-" if method.startswith(solid) else "--", label=f"{method} {dataset}/{noise}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"test {name}")
        ax.grid(alpha=0.3)
        ax.set_title(f"{name} over training{title}")
    if not rows.empty:
        axes[1].legend(fontsize=7)
    _save(fig, path)
