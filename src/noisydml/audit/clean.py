"""Acting on an audit: a ``folder`` dataset's listing with the suspected training labels dropped or relabelled.

The output is the ``folder`` kind's CSV form (``path,label,split`` and ``is_clean`` where the source listing has
it), so retraining on it is a change of ``datasets.<name>.csv``. What it keeps exactly: every test (query,
gallery) row and its label, every training row the audit does not act on, and each row's split (written out, so
the cleaned listing has the same class-disjoint split as the prepared dataset, whatever rows it lost).

Which rows it acts on is ours: a training row is **suspected** when at least ``min_agree`` detectors flag it
(``agree`` of :func:`noisydml.audit.sheet.rank_suspects`). ``drop`` removes suspected rows; ``relabel`` gives a
suspected row the detectors' suggested label and drops it where there is no suggestion (open-set noise). A
training class left with a single row loses it too (metric learning needs two images per class, and the
``folder`` kind refuses one).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.data.folder import list_items

ACTIONS = ("drop", "relabel")


def check_action(action: str, min_agree: int, detectors: int) -> None:
    if action not in ACTIONS:
        raise ValueError(f"action {action!r}: allowed {', '.join(ACTIONS)}")
    if not 1 <= min_agree <= detectors:
        raise ValueError(f"min_agree {min_agree}: allowed 1..{detectors} (the detectors audited)")


def actions(suspects: pd.DataFrame, action: str, min_agree: int) -> pd.DataFrame:
    """Per suspected training row: ``sample_id, given_label, new_label`` (training label ids; -1 = dropped)."""
    check_action(action, min_agree, int(suspects["detectors"].max()))
    acted = suspects[suspects["agree"] >= min_agree]
    new = acted["suggested_label"].to_numpy() if action == "relabel" else np.full(len(acted), -1)
    out = pd.DataFrame({"sample_id": acted["sample_id"].to_numpy(), "given_label": acted["given_label"].to_numpy(),
                        "new_label": new})
    return out[out["new_label"] != out["given_label"]].reset_index(drop=True)  # a suggestion equal to the label: kept


def cleaned_listing(cfg: dict, base_dir: str | Path, manifest: pd.DataFrame, training_names: pd.Series,
                    suspects: pd.DataFrame, action: str, min_agree: int, out_csv: str | Path) -> dict:
    """Write ``out_csv``: the dataset's listing (``cfg``: its ``folder`` config, paths relative to ``base_dir``)
    with :func:`actions` applied. ``manifest``: the prepared dataset's (its sample ids are the listing's rows in
    order); ``training_names``: training label id -> class name (the noisy label table's, which may differ from the
    manifest's ids); ``suspects``: :func:`~noisydml.audit.sheet.rank_suspects` of a run of this dataset. Training
    rows get the label they were trained on. Returns counts of what it did."""
    base_dir, out_csv = Path(base_dir), Path(out_csv)
    items, _, _ = list_items(cfg, base_dir)
    listed = [str(it[1]) for it in items]
    if len(items) != len(manifest) or listed != manifest["class_name"].astype(str).tolist():
        raise ValueError(f"the dataset's listing ({len(items)} rows) is not the prepared one ({len(manifest)} "
                         "rows) in the same order: it changed since it was prepared; run the prepare stage again")
    table = pd.DataFrame({"path": [os.path.relpath(Path(it[0]).resolve(), out_csv.parent.resolve())
                                   for it in items],
                          "label": listed, "split": manifest["split"].astype(str).to_numpy()})
    if any(not np.isnan(it[2]) for it in items):
        table["is_clean"] = [("" if np.isnan(it[2]) else str(int(it[2]))) for it in items]
    trained = suspects.set_index("sample_id")["given_label"]
    if not trained.index.isin(manifest.index[manifest["split"] == "train"]).all():
        raise ValueError("the audit has rows that are not the dataset's training rows: an audit of another dataset?")
    table.loc[trained.index, "label"] = training_names.loc[trained.to_numpy()].astype(str).to_numpy()
    acted = actions(suspects, action, min_agree)
    dropped = acted.loc[acted["new_label"] < 0, "sample_id"].to_numpy()
    relabelled = acted[acted["new_label"] >= 0]
    table.loc[relabelled["sample_id"].to_numpy(), "label"] = \
        training_names.loc[relabelled["new_label"].to_numpy()].astype(str).to_numpy()
    table = table.drop(index=dropped)
    counts = table[table["split"] == "train"].groupby("label").size()
    lonely = table.index[(table["split"] == "train") & table["label"].isin(counts[counts < 2].index)]
    table = table.drop(index=lonely)
    io.write_with(out_csv, lambda path: table.to_csv(path, index=False))
    return {"rows": int(len(items)), "training_rows": int(len(trained)), "dropped": int(len(dropped)),
            "relabelled": int(len(relabelled)), "dropped_single_left": int(len(lonely)), "written": int(len(table)),
            "action": action, "min_agree": int(min_agree)}
