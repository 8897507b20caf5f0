"""The noisy-label classification baselines of PRISM's and SGPS's tables, as a study: their comparison with plain
cross-entropy on the same backbone and features.

PRISM's and SGPS's argument rests on these rows: "methods designed for classification do not transfer to
retrieval". Their published numbers fill the papers' tables through references/papers/*.csv (the report's generic
section) when they run on the tables' data; this section compares them with ``cross_entropy`` per seed wherever
the grid trains them (e.g. ``-S 'grid.methods=[cross_entropy, coteaching, ...]'``, or the method set
``classification_baselines``), with what their decisions' diagnostics show, scored by the trainer from ground
truth the methods never see: the selection of the clean set (Co-teaching family, DivideMix, UNICON), relabelling
(DivideMix's refined and guessed targets, LRA-Diffusion's sampled labels), and the epoch LabelWave picks beside
the test curve's best (shown, never used: the test set selects nothing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.studies.base import Claim, ReportContext, Study

#: The family, in the papers' row order; ``cross_entropy`` is the base every row is compared with.
METHODS = ("cross_entropy", "normalized_softmax", "coteaching", "coteaching_plus", "coteaching_t", "f_correction",
           "unicon", "dividemix", "lra_diffusion", "labelwave")
BASE = "cross_entropy"
#: Methods that pick the reported epoch themselves, without validation data.
PICKS_EPOCH = ("labelwave",)
DIAGNOSTICS = {"final_diag_selection_precision": "selection precision", "final_diag_selection_recall":
               "selection recall", "final_diag_pseudo_label_accuracy": "relabelling accuracy"}


def best_test_epoch(curve) -> int | None:
    """The epoch (1-based) of the highest monitored test P@1 (epochs not monitored are None)."""
    values = [np.nan if v is None else float(v) for v in (curve if isinstance(curve, list) else [])]
    return int(np.nanargmax(values)) + 1 if values and not np.all(np.isnan(values)) else None


def comparison(per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, noise, method, seed) of the family: P@1, MAP@R, P@1 minus cross-entropy's at the same
    seed, the diagnostics, and for a method that picks its epoch the one it picked beside the test curve's best."""
    empty = pd.DataFrame(columns=["dataset", "noise", "method", "seed", "P@1", "MAP@R", f"P@1 - {BASE}",
                                  *DIAGNOSTICS.values()])
    if per_seed.empty:
        return empty
    runs = per_seed[per_seed["method"].isin(METHODS)]
    if runs.empty:  # none of the family in the grid (the default): the CSV's header only
        return empty
    base = runs[runs["method"] == BASE].set_index(["dataset", "noise", "seed"])["precision_at_1"]
    rows = []
    for r in runs.to_dict("records"):
        key = (r["dataset"], r["noise"], r["seed"])
        row = {"dataset": r["dataset"], "noise": r["noise"], "method": r["method"], "seed": r["seed"],
               "P@1": 100 * r["precision_at_1"], "MAP@R": 100 * r["mean_average_precision_at_r"],
               f"P@1 - {BASE}": 100 * (r["precision_at_1"] - base[key]) if key in base.index else np.nan}
        row.update({label: r.get(column) for column, label in DIAGNOSTICS.items()})
        if r["method"] in PICKS_EPOCH:
            row["epoch picked"] = r.get("selected_epoch")
            row["best test epoch (not used)"] = best_test_epoch(r.get("curve_test_precision_at_1"))
        rows.append(row)
    order = {m: i for i, m in enumerate(METHODS)}
    return pd.DataFrame(rows).sort_values(["dataset", "noise", "method", "seed"],
                                          key=lambda s: s.map(order) if s.name == "method" else s)


def report(ctx: ReportContext) -> list[str]:
    table = comparison(ctx.per_seed)
    io.write_with(ctx.out / "classification_baselines.csv",
                  lambda p: table.to_csv(p, index=False, float_format="%.6f"))
    md = ["## The noisy-label classification baselines against cross-entropy", "",
          "PRISM's and SGPS's classification baselines, trained with cross-entropy (or the normalised softmax) on "
          "the grid's backbone and retrieving with the L2-normalised penultimate features (SGPS Sec. IV-B), per "
          "seed, with P@1 minus plain cross-entropy's (`cross_entropy`) at the same seed. Diagnostics from ground "
          "truth the methods never see: selection precision/recall of the clean set, relabelling accuracy; "
          "LabelWave's picked epoch beside the best epoch of the monitored test curve (shown, never used).", ""]
    if table.empty:
        return md + ["(none of these methods is in the grid: e.g. -S 'grid.methods=[cross_entropy, coteaching, "
                     "dividemix]')", ""]
    shown = table.dropna(axis=1, how="all")
    return md + [shown.round(2).to_markdown(index=False), "",
                 f"[classification_baselines.csv]({ctx.link('classification_baselines.csv')})", ""]


STUDY = Study(name="classification_baselines", title="Noisy-label classification baselines", report=report,
              claims=(Claim("coteaching", "cross_entropy", "Co-teaching above plain cross-entropy"),
                      Claim("coteaching_t", "cross_entropy", "Co-teaching w/ T above plain cross-entropy")))
