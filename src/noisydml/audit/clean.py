"""Acting on an audit: a ``folder`` dataset's listing with the suspected training labels dropped or relabelled.

The output is the ``folder`` kind's CSV form (``path,label,split`` and ``is_clean`` where the source listing has
it), so retraining on it is a change of ``datasets.<name>.csv``. What it keeps exactly: every test (query,
gallery) row and its label, every training row the audit does not act on, and each row's split (written out, so
the cleaned listing has the same class-disjoint split as the prepared dataset, whatever rows it lost).

Which rows it acts on (:func:`plan`; every threshold here is ours):

- ``rule="estimate"`` (the default): the ``round(rate x N)`` rows of highest consensus
  (:func:`noisydml.audit.sheet.rank_suspects`), ``rate`` the audit's estimate of the noise rate, so the share acted
  on follows the estimate rather than each detector's own threshold (those flagged 53 % of a folder dataset 21 %
  wrong);
- ``rule="agree"``: the rows at least ``min_agree`` detectors flag.

It refuses, saying why, when the share it would act on passes ``max_share`` (:data:`MAX_SHARE`), or when the
detectors disagree about which rows are wrong: the overlap of two detectors' top sets of that size below
``min_overlap`` (:data:`MIN_OVERLAP`) for some pair of the detectors that need no method. ``force`` acts anyway.
``drop`` removes the rows; ``relabel`` gives a row a new label only where at least :data:`RELABEL_SUPPORT`
detectors suggest that same class, and drops it otherwise (open-set noise has no right class to suggest). A
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
RULES = ("estimate", "agree")
#: Ours: the largest share of the training rows a cleaning acts on without ``force``.
MAX_SHARE = 0.3
#: Ours: the least overlap (shared share) of two detectors' top sets for a cleaning to go ahead without ``force``.
MIN_OVERLAP = 0.5
#: Ours: how many detectors must suggest the same class for ``relabel`` to use it.
RELABEL_SUPPORT = 2
#: The ``method`` detector (a run's own decisions) is left out of the overlap check: it ranks by the method's
#: decisions, not the embedding's classes.
OVERLAP_EXCLUDES = ("method",)


class CleaningRefused(ValueError):
    """A cleaning the audit will not write without ``force``; the message says why and what to change."""


def check_action(action: str, min_agree: int, detectors: int, rule: str = "agree") -> None:
    if action not in ACTIONS:
        raise ValueError(f"action {action!r}: allowed {', '.join(ACTIONS)}")
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: allowed {', '.join(RULES)}")
    if rule == "agree" and not 1 <= min_agree <= detectors:
        raise ValueError(f"min_agree {min_agree}: allowed 1..{detectors} (the detectors audited)")


def top_overlaps(audits: dict[str, pd.DataFrame], count: int) -> dict[str, float]:
    """For each pair of the detectors that need no method: the share of their ``count`` most suspected rows (ties
    by sample id) that both hold."""
    names = sorted(name for name in audits if name.split("/")[-1] not in OVERLAP_EXCLUDES)  # "<run>/<detector>"
    tops = {name: set(audits[name].sort_values(["score", "sample_id"], ascending=[False, True], kind="stable")
                      ["sample_id"].head(count)) for name in names}
    return {f"{a}~{b}": len(tops[a] & tops[b]) / count for i, a in enumerate(names) for b in names[i + 1:]}


def plan(suspects: pd.DataFrame, audits: dict[str, pd.DataFrame], rate: float, action: str = "drop",
         rule: str = "estimate", min_agree: int = 2, max_share: float = MAX_SHARE, min_overlap: float = MIN_OVERLAP,
         force: bool = False) -> tuple[pd.DataFrame, dict]:
    """Which training rows a cleaning acts on and how: ``(actions, facts)``. ``actions``: per acted row
    ``sample_id, given_label, new_label`` (-1 = dropped); ``facts``: the rule, the estimate, the share acted on,
    the detectors' overlaps and the warnings. Raises :class:`CleaningRefused` (unless ``force``) as the module
    docstring says."""
    check_action(action, min_agree, int(suspects["detectors"].max()), rule)
    n = len(suspects)
    if rule == "estimate":
        if not np.isfinite(rate):
            raise ValueError("rule 'estimate' needs the audit's estimate of the noise rate: audit with a "
                             "confident-learning detector, or use rule 'agree'")
        acted = suspects.head(int(round(rate * n)))  # rank_suspects: most suspected first, ties by sample id
    else:
        acted = suspects[suspects["agree"] >= min_agree]
    share = len(acted) / n
    overlaps = top_overlaps(audits, len(acted)) if len(acted) else {}
    facts = {"rule": rule, "estimated_noise_rate": float(rate), "acted_share": share, "overlaps": overlaps,
             "warnings": []}
    problems = []
    if share > max_share:
        problems.append(f"it would act on {share:.1%} of the training rows, above max_share {max_share:.0%} "
                        f"(the estimated noise rate is {rate:.1%}): retraining on what is left may lose more "
                        "than the wrong labels cost")
    weak = {pair: value for pair, value in overlaps.items() if value < min_overlap}
    if weak:
        problems.append("the detectors disagree about which rows are wrong: their top sets overlap "
                        + ", ".join(f"{pair} {value:.2f}" for pair, value in weak.items())
                        + f", below min_overlap {min_overlap:.2f}")
    if problems and not force:
        raise CleaningRefused("; ".join(problems) + ". Look at the contact sheet first; act anyway with --force, "
                              "or change --max-share / --min-overlap")
    facts["warnings"] = problems
    if action == "relabel":
        trusted = (acted["suggested_by"] >= RELABEL_SUPPORT) & (acted["suggested_label"] >= 0)
        new = np.where(trusted, acted["suggested_label"].to_numpy(), -1)
    else:
        new = np.full(len(acted), -1)
    out = pd.DataFrame({"sample_id": acted["sample_id"].to_numpy(), "given_label": acted["given_label"].to_numpy(),
                        "new_label": new})
    return out[out["new_label"] != out["given_label"]].reset_index(drop=True), facts


def cleaned_listing(cfg: dict, base_dir: str | Path, manifest: pd.DataFrame, training_names: pd.Series,
                    suspects: pd.DataFrame, acted: pd.DataFrame, out_csv: str | Path) -> dict:
    """Write ``out_csv``: the dataset's listing (``cfg``: its ``folder`` config, paths relative to ``base_dir``)
    with ``acted`` applied. ``manifest``: the prepared dataset's (its sample ids are the listing's rows in
    order); ``training_names``: training label id -> class name (the noisy label table's, which may differ from the
    manifest's ids); ``suspects``: :func:`~noisydml.audit.sheet.rank_suspects` of a run of this dataset;
    ``acted``: :func:`plan`'s actions. Training rows get the label they were trained on. Returns counts of what it
    did, with the training classes it emptied (``emptied``: their names; a warning to read)."""
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
    dropped = acted.loc[acted["new_label"] < 0, "sample_id"].to_numpy()
    relabelled = acted[acted["new_label"] >= 0]
    table.loc[relabelled["sample_id"].to_numpy(), "label"] = \
        training_names.loc[relabelled["new_label"].to_numpy()].astype(str).to_numpy()
    table = table.drop(index=dropped)
    counts = table[table["split"] == "train"].groupby("label").size()
    lonely = table.index[(table["split"] == "train") & table["label"].isin(counts[counts < 2].index)]
    table = table.drop(index=lonely)
    left = set(table.loc[table["split"] == "train", "label"])
    emptied = sorted(set(training_names.loc[trained.to_numpy()].astype(str)) - left)
    io.write_with(out_csv, lambda path: table.to_csv(path, index=False))
    return {"rows": int(len(items)), "training_rows": int(len(trained)), "dropped": int(len(dropped)),
            "relabelled": int(len(relabelled)), "dropped_single_left": int(len(lonely)), "written": int(len(table)),
            "training_rows_written": int((table["split"] == "train").sum()), "emptied": emptied}
