"""PRISM (CVPR 2021) as a study: its training times beside ours.

PRISM's tables themselves (Tables 1-3) are in the report's generic "papers' tables beside ours" section, from
references/papers/prism.csv; its selection is scored by the trainer for every method that selects samples. What is
PRISM's own here: the slides' training-time table (CARS-98N, seconds), matched to the ``timing`` stage's entries by
method and by whether PRISM's class centres are on.
"""

from __future__ import annotations

import pandas as pd

from noisydml.studies.base import Claim, ReportContext, Study


def paper_seconds(references: pd.DataFrame) -> dict[tuple[str, bool | None], tuple[str, float]]:
    """The slides' training times: (method, centres: True / False, None where the row has no PRISM) -> (row, s)."""
    rows = references[(references["paper"] == "PRISM") & (references["table"] == "Timing")]
    out = {}
    for row in rows.itertuples():
        centres = False if "without centers" in row.row else True if "with centers" in row.row else None
        out[(row.method, centres)] = (row.row, float(row.value))
    return out


def report(ctx: ReportContext) -> list[str]:
    if not ctx.timing:
        return []
    paper = paper_seconds(ctx.references)
    first = ctx.timing[0]
    first_paper = paper.get((first["method"], first.get("centres")))
    rows = []
    for r in ctx.timing:
        seconds = paper.get((r["method"], r.get("centres")))
        rows.append({"method": r["label"], "seconds/epoch": round(r["seconds_per_epoch"], 2),
                     "x first row": round(r["seconds_per_epoch"] / first["seconds_per_epoch"], 2),
                     "PRISM paper (CARS-98N, s)": seconds[1] if seconds else "-",
                     "paper x first row": round(seconds[1] / first_paper[1], 2) if seconds and first_paper else "-"})
    return ["## Training time beside PRISM's", "",
            "Our seconds per epoch (the `timing` stage) beside PRISM's published training times (the slides' table, "
            "CARS-98N, BN-Inception on a GPU). Compare the ratios, not the seconds.", "",
            pd.DataFrame(rows).to_markdown(index=False), ""]


#: What PRISM's claims hinge on: how well its selection separates clean from noisy samples.
SELECTION = (("final_diag_selection_precision", "kept: clean share"),
             ("final_diag_selection_recall", "clean samples kept"))

STUDY = Study(name="prism", title="PRISM (CVPR 2021)", report=report,
              claims=(Claim("prism", "mcl", "PRISM above its base loss MCL (Tables 1-2)", diagnostics=SELECTION),
                      Claim("softtriple_prism", "softtriple", "PRISM lifts SoftTriple (Tables 1-2)", diagnostics=SELECTION)))
