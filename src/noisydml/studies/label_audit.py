"""The label audit as a study: its params section (``figures.label_audit``: which datasets the ``audit@`` stages
audit, and how) and its report section (the detectors judged on known noise, and their precision-recall curves).

The audit itself is :mod:`noisydml.audit` (one stage per dataset and noise setting, :mod:`noisydml.pipeline.audit`);
this study reads what those stages wrote, ``audit/<dataset>/<noise>/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from noisydml import io
from noisydml.audit import DETECTORS
from noisydml.schema import ParamsError
from noisydml.studies.base import ReportContext, Study

SECTION = "label_audit"
#: Where the audit stages write (one folder per dataset and noise setting), relative to the repository root.
AUDIT_ROOT = Path("audit")
#: The section's keys, each with its type and lower bound (every one written out in params.yaml).
KEYS = {"datasets": list, "methods": list, "detectors": list, "k": int, "folds": int, "temperature": float,
        "top": int, "bootstrap_samples": int}
LOWEST = {"k": 1, "folds": 2, "top": 1, "bootstrap_samples": 100}
KIND_NAMES = {int: "n integer", float: " number", list: " list"}
#: The judged figures the report shows, as it names them.
SHOWN = {"auroc": "AUROC", "auprc": "AUPRC", "precision_at_k": "P@k", "flag_f1": "flag F1",
         "weighted_f1": "weighted F1 (AQuA)"}


def check_section(section: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``figures.label_audit``: ``datasets`` (of ``grid.datasets``; [] = no audit), ``methods`` (of
    ``grid.methods``; [] = every grid method), ``detectors`` (a non-empty list of
    :data:`noisydml.audit.DETECTORS`), ``k`` (neighbours of Datalab and kNN disagreement), ``folds`` (of
    the cross-fitted probes), ``temperature`` (of the centroid probe's softmax), ``top`` (rows of the contact
    sheet), ``bootstrap_samples`` (of the paired bootstrap)."""
    where = f"figures.{SECTION}"
    if not isinstance(section, dict):
        raise ParamsError(f"{where}: expected a mapping with keys {', '.join(KEYS)}; got {section!r}")
    unknown, missing = sorted(set(section) - set(KEYS)), [k for k in KEYS if k not in section]
    if unknown or missing:
        raise ParamsError(f"{where}: " + (f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}")
                          + f"; allowed (each written out): {', '.join(KEYS)}")
    for key, kind in KEYS.items():
        value = section[key]
        if not isinstance(value, (int, float) if kind is float else kind) or isinstance(value, bool):
            raise ParamsError(f"{where}.{key}: {value!r} is not a{KIND_NAMES[kind]}")
        if kind is int and value < LOWEST[key]:
            raise ParamsError(f"{where}.{key}: {value!r}; allowed: an integer >= {LOWEST[key]}")
        if kind is float and not value > 0:
            raise ParamsError(f"{where}.{key}: {value!r}; allowed: a number > 0")
    for key, allowed in (("datasets", params["grid"]["datasets"]), ("methods", params["grid"]["methods"]),
                         ("detectors", DETECTORS)):
        for name in section[key]:
            if name not in allowed:
                raise ParamsError(f"{where}.{key}: {name!r} is not allowed; allowed: {', '.join(allowed)}")
    if not section["detectors"]:
        raise ParamsError(f"{where}.detectors: []; allowed: a non-empty list of {', '.join(DETECTORS)}")
    return section


def _read(dataset: str, noise: str, name: str) -> pd.DataFrame:
    path = AUDIT_ROOT / dataset / noise / name
    return pd.read_csv(path).assign(dataset=dataset, noise=noise) if path.is_file() else pd.DataFrame()


def audit_tables(ctx: ReportContext, section: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The audited settings' judged rows, bootstrap differences and precision-recall curves (each all settings)."""
    from noisydml.sections.grid import noises_of

    settings = [(d, n) for d in section["datasets"] for n in noises_of(ctx.params["grid"])]
    frames = [[_read(d, n, name) for d, n in settings] for name in ("judged.csv", "differences.csv",
                                                                      "pr_curves.csv")]
    return tuple(pd.concat(f, ignore_index=True) if any(len(x) for x in f) else pd.DataFrame() for f in frames)


def summary(judged: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, noise, run (``method``: a grid run's name) and detector: each shown figure's mean over seeds,
    and the seeds."""
    keys = ["dataset", "noise", "method", "detector"]
    table = judged.groupby(keys, sort=False)[list(SHOWN)].mean()
    table["seeds"] = judged.groupby(keys, sort=False)["seed"].nunique()
    return table.reset_index()


def plot_pr(curves: pd.DataFrame, path: Path, noise_names: dict) -> None:
    """One panel per (dataset, noise): each detector's precision against recall, averaged over runs and seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(zip(curves["dataset"], curves["noise"])))
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.8), squeeze=False)
    for ax, (dataset, noise) in zip(axes[0], settings):
        part = curves[(curves["dataset"] == dataset) & (curves["noise"] == noise)]
        for detector, rows in part.groupby("detector", sort=False):
            mean = rows.groupby("recall")["precision"].mean()
            ax.plot(mean.index, mean.to_numpy(), label=detector)
        ax.set_title(f"{dataset}, {noise_names.get((dataset, noise), noise)}")
        ax.set_xlabel("recall of wrong labels")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("precision")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    io.write_with(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)


def report(ctx: ReportContext) -> list[str]:
    section = check_section(ctx.params["figures"][SECTION], ctx.params)
    md = ["## Label audit", ""]
    if not section["datasets"]:
        how = 'README "Find the wrong labels in your data"'
        return md + [f"Not run: `figures.label_audit.datasets` is empty ({how} says how to turn it on).", ""]
    judged, differences, curves = audit_tables(ctx, section)
    if judged.empty:
        return md + ["No setting with known wrong labels was audited.", ""]
    io.write_with(ctx.out / "judged.csv", lambda p: judged.to_csv(p, index=False, float_format="%.6f"))
    io.write_with(ctx.out / "differences.csv", lambda p: differences.to_csv(p, index=False, float_format="%.6f"))
    table = summary(judged).round({k: 3 for k in SHOWN}).rename(columns=SHOWN)
    md += ["Every detector on each audited run's training embeddings, judged against the corrupt stage's truth "
           "(which no detector sees): AUROC and AUPRC of its score (AUPRC's chance = the noise rate), precision "
           "at k = the true number of wrong labels, F1 of its own flags; the mean over seeds (per seed: "
           f"[judged.csv]({ctx.link('judged.csv')}); the method's own score against cleanlab's with a paired "
           f"bootstrap: [differences.csv]({ctx.link('differences.csv')})).", "",
           ctx.markdown(table, dash="the detector makes no flags of its own"), ""]
    if not curves.empty:
        plot_pr(curves, ctx.figure("precision_recall"), ctx.noise_names)
        md += [ctx.embed("precision_recall", "Precision against recall of each detector"), ""]
    return md


STUDY = Study(name=SECTION, title="Label audit", sections={SECTION: check_section}, report=report)
