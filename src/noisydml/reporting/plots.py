"""Plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


#: The report's figures folder (a DVC plots folder: DVC renders every file in it, and a PDF is no plot) and the
#: folder beside it that holds their PDFs.
FIGURES, PDFS = "figures", "pdf"


def pdf_path(png: Path) -> Path:
    """Where the PDF of figure ``png`` goes: ``reports/pdf/<name>.pdf`` for a figure of ``reports/figures/``,
    beside the PNG otherwise."""
    if png.parent.name == FIGURES:
        return png.parent.parent / PDFS / png.with_suffix(".pdf").name
    return png.with_suffix(".pdf")


def _save(fig, path: Path, vector: bool = False) -> None:
    """``path`` (PNG); with ``vector``, the same figure as PDF (:func:`pdf_path`, for a paper), without the
    creation date so that the same figure gives the same bytes."""
    from noisydml import io

    io.write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    if vector:
        io.write_with(pdf_path(path), lambda tmp: fig.savefig(
            tmp, format="pdf", bbox_inches="tight", metadata={"CreationDate": None, "ModDate": None}))
    plt.close(fig)


def _legend_right(ax, title: str | None = None) -> None:
    """The panel's legend outside its axes, on the right: never over the data."""
    ax.legend(fontsize=7, title=title, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0, frameon=False)


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


def plot_noise_per_class(tables: dict[str, pd.DataFrame], nominal: dict[str, float], path: Path, vector: bool = False) -> None:
    """Per noise setting: histograms over classes of the impurity (share of a training label's samples
    that are not of that class) and of the flip-out rate (share of a class's own images relabelled).

    ``tables`` maps a panel's title (the dataset and the setting's name) to its ``per_class.csv``, ``nominal`` the
    same titles to the nominal rate (a share; drawn in %).
    """
    import numpy as np

    n = len(tables)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.6, 3.2 * rows), squeeze=False, layout="constrained")
    bins = np.linspace(0, 100, 21)
    for ax, (title, table) in zip(axes.ravel(), tables.items()):
        impurity = 100 * table.loc[table["label"] >= 0, "impurity"].dropna()
        flip_out = 100 * table.loc[table["images"] > 0, "flip_out_rate"].dropna()
        ax.hist(impurity, bins=bins, alpha=0.6, label="impurity of a kept label")
        ax.hist(flip_out, bins=bins, histtype="step", linewidth=1.5, label="flip-out rate of a class")
        ax.axvline(100 * nominal[title], color="k", linestyle=":", linewidth=1, label="nominal rate")
        ax.set_title(f"{title} ({len(impurity)} of {len(flip_out)} classes kept)", fontsize=9)
        ax.set_xlabel("wrong labels (%)")
        ax.set_ylabel("classes")
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if n:
        fig.legend(*axes[0, 0].get_legend_handles_labels(), fontsize=7, loc="outside right center", frameon=False)
    _save(fig, path, vector)


def plot_weight_histograms(per_seed: pd.DataFrame, path: Path, column: str = "histogram_weights",
                           xlabel: str = "final weight", empty: str = "no run in the grid weights samples",
                           vector: bool = False, labels: dict[str, str] | None = None,
                           noise_names: dict[tuple[str, str], str] | None = None) -> None:
    """Final sample weights (or another per-sample decision's ``histogram_*``) of truly clean vs truly noisy
    samples, the seeds' histograms added up (the trainer's, from ground truth): one row of panels per run, one
    column per (dataset, noise setting), one legend outside."""
    labels, noise_names = labels or {}, noise_names or {}
    rows = per_seed.dropna(subset=[column]) if column in per_seed else per_seed.iloc[:0]
    runs = list(dict.fromkeys(rows["method"])) if not rows.empty else []
    settings = list(dict.fromkeys(zip(rows["dataset"], rows["noise"]))) if not rows.empty else []
    fig, axes = plt.subplots(max(1, len(runs)), max(1, len(settings)), squeeze=False, layout="constrained",
                             figsize=(3.0 * max(1, len(settings)) + 1.4, 2.4 * max(1, len(runs))))
    if not runs:
        axes[0, 0].text(0.5, 0.5, empty, ha="center", va="center")
        axes[0, 0].set_axis_off()
    for r, run in enumerate(runs):
        for c, (dataset, noise) in enumerate(settings):
            ax = axes[r, c]
            group = rows[(rows["method"] == run) & (rows["dataset"] == dataset) & (rows["noise"] == noise)]
            ax.set_title(f"{labels.get(run, run)}\n{dataset}, {noise_names.get((dataset, noise), noise)}", fontsize=8)
            if group.empty:
                ax.set_axis_off()
                continue
            edges = np.asarray(group[column].iloc[0]["edges"])
            for kind, colour in (("clean", "C0"), ("noisy", "C3")):
                counts = np.sum([h[kind] for h in group[column]], axis=0).astype(float)
                share = 100 * counts / counts.sum() if counts.sum() else counts
                ax.bar(edges[:-1], share, width=np.diff(edges), align="edge", alpha=0.55, color=colour,
                       label=f"truly {kind} samples")
            if r == len(runs) - 1:
                ax.set_xlabel(xlabel, fontsize=8)
            if c == 0:
                ax.set_ylabel("share of the group (%)", fontsize=8)
    if runs:
        handles, names = next((ax.get_legend_handles_labels() for ax in axes.ravel() if ax.get_legend_handles_labels()[0]),
                              ([], []))
        fig.legend(handles, names, fontsize=7, loc="outside right center", frameon=False)
    _save(fig, path, vector)


def plot_grid_maps(table: pd.DataFrame, title: str, path: Path, columns: tuple[str, ...] = ("maw", "sdaw"),
                   empty: str = "no cells", vector: bool = False) -> None:
    """``columns`` of ``table`` as heatmaps over its ``lambda`` (x) and ``mu`` (y) columns, values written in the
    cells (e.g. a weight step's MAW and SDAW over its age and balance)."""
    fig, axes = plt.subplots(1, len(columns), figsize=(4.8 * len(columns), 3.8), squeeze=False, layout="constrained")
    axes = axes[0]
    if table.empty:
        for ax in axes:
            ax.set_axis_off()
        axes[0].text(0.5, 0.5, empty, ha="center", va="center")
        _save(fig, path, vector)
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
    _save(fig, path, vector)


def plot_embedding_size(table: pd.DataFrame, title: str, path: Path, empty: str = "no runs", vector: bool = False) -> None:
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
        _legend_right(ax)
        ax.set_title(title, fontsize=9)
    _save(fig, path, vector)


def plot_training_curves(per_seed: pd.DataFrame, path: Path, methods: tuple[str, ...], solid: tuple[str, ...] = (),
                         title: str = "", empty: str = "no such run in the grid", vector: bool = False,
                         labels: dict[str, str] | None = None,
                         noise_names: dict[tuple[str, str], str] | None = None) -> None:
    """Test P@1 and MAP@R (%) over training (monitoring passes every ``train.eval_every`` epochs), mean over seeds,
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
            setting = (noise_names or {}).get((dataset, noise), noise)
            ax.plot(epochs[shown], 100 * mean[shown], marker="o", markersize=3, color=f"C{i % 10}",
                    linestyle="-" if method.startswith(solid) else "--",
                    label=f"{(labels or {}).get(method, method)} · {dataset}, {setting}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"test {name} (%)")
        ax.grid(alpha=0.3)
        ax.set_title(f"{name} over training{title}")
    if not rows.empty:
        _legend_right(axes[1])
    _save(fig, path, vector)
