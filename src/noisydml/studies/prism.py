"""PRISM (CVPR 2021) as a study: its training times beside ours, and its selection at the grid's scale.

PRISM's tables themselves (Tables 1-3) are in the report's generic "papers' tables beside ours" section, from
references/papers/prism.csv; its selection is scored by the trainer for every method that selects samples. What is
PRISM's own here: the slides' training-time table (CARS-98N, seconds), matched to the ``timing`` stage's entries by
method and by whether PRISM's class centres are on; and how much of a batch PRISM's selection keeps at the papers'
scales under the authors' rule and ours (simulated by ``scripts/bench_prism_scale.py --profiles``: where the
classes far outnumber what the memory holds, the authors' rule keeps almost none of the scorable samples, the
profiles' audit's P26).
"""

from __future__ import annotations

import json
from pathlib import Path

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


#: The kept shares of PRISM's selection at the papers' scales, simulated (scripts/bench_prism_scale.py --profiles);
#: the report stage depends on the file (dvc.yaml).
KEPT_SHARES = "references/prism_selection_scale.json"


def selection_caption(path: str | Path = KEPT_SHARES) -> list[str]:
    """The report's note on PRISM's selection at the papers' scales: per simulated setting (training classes,
    memory, R), the kept share of the scorable samples under the authors' rule and ours (the profiles' audit's P26)."""
    path = Path(path)
    if not path.is_file():
        return []
    settings = json.loads(path.read_text())["settings"]
    rows = []
    for s in sorted(settings, key=lambda s: (s["classes"], s["memory_size"], -s["noise_rate"])):
        rows.append({"training classes": f"{s['classes']:,}", "memory": f"{s['memory_size']:,}",
                     "R": f"{s['noise_rate']:g}", "scorable (of a batch)": f"{s['ours']['scorable_share']:.1%}",
                     "kept of scorable: authors' rule": f"{s['authors']['kept_share_of_scorable']:.1%}",
                     "ours": f"{s['ours']['kept_share_of_scorable']:.1%}",
                     "profiles": ", ".join(s["profiles"])})
    return ["## PRISM's selection at the papers' scales", "",
            "Of the samples PRISM can score (their class has a centre in the memory), how many its selection keeps at "
            "each paper profile's scale, simulated (P x K batches of class-structured embeddings, 50 % symmetric "
            "noise; `scripts/bench_prism_scale.py --profiles`): the authors' rule ranks unscorable samples with the "
            "rest at P_clean = 1, so where the classes far outnumber the memory it keeps almost none of the scorable "
            "ones; ours ranks the scorable ones only (docs/methods/prism.md).", "",
            pd.DataFrame(rows).to_markdown(index=False), ""]


def report(ctx: ReportContext) -> list[str]:
    caption = selection_caption()
    if not ctx.timing:
        return caption
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
    return caption + ["## Training time beside PRISM's", "",
            "Our seconds per epoch (the `timing` stage) beside PRISM's published training times (the slides' table, "
            "CARS-98N, BN-Inception on a GPU). Compare the ratios, not the seconds.", "",
            pd.DataFrame(rows).to_markdown(index=False), ""]


#: What PRISM's claims hinge on: how well its selection separates clean from noisy samples.
SELECTION = (("final_diag_selection_precision", "kept: clean share"),
             ("final_diag_selection_recall", "clean samples kept"))

STUDY = Study(name="prism", title="PRISM (CVPR 2021)", report=report,
              claims=(Claim("prism", "mcl", "PRISM above its base loss MCL (Tables 1-2)", diagnostics=SELECTION),
                      Claim("softtriple_prism", "softtriple", "PRISM lifts SoftTriple (Tables 1-2)", diagnostics=SELECTION)))
