"""The audit stage: every trained grid run of one dataset and noise setting audited, judged where the truth is
known, and one contact sheet of the suspects over all of them (``audit/<dataset>/<noise>/``).

What it writes (one folder, replaced whole when the stage finishes):

- ``scores/<run>-seed<k>.csv``: every detector's per-sample scores of that run in the audit schema
  (:data:`noisydml.audit.AUDIT_COLUMNS`), one ``detector`` column beside them;
- ``judged.csv``: per run, seed and detector, :func:`noisydml.audit.judge.judge`'s figures, runtime, peak memory,
  and the confident-learning detectors' estimates of the noise rate (rows only where some label is known to be
  wrong);
- ``differences.csv``: per run and seed, the method's own score against each cleanlab detector, AUROC and AUPRC
  differences with a paired bootstrap over the training rows (:func:`~noisydml.audit.judge.paired_bootstrap`);
- ``pr_curves.csv``: per run, seed and detector, precision at recall 0, 0.01, ..., 1 (the interpolated curve);
- ``sheet/``: the contact sheet (``index.html``, ``suspects.csv`` ranked over every run's detectors, ``thumbs/``).

Reads the runs' training embeddings and decisions, the corrupt stage's label tables and the training rows' images;
never a test embedding or a test image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.audit.judge import paired_bootstrap
from noisydml.audit.run import (audit_run, estimated_rate, judged_table, known_noise, training_class_names,
                                truth_of)
from noisydml.audit.sheet import rank_suspects, write_sheet
from noisydml.data.prepared import PreparedDataset
from noisydml.pipeline.layout import TRAIN_EMBEDDINGS, Layout
from noisydml.schema import ParamsError
from noisydml.studies.label_audit import AUDIT_ROOT, SECTION, check_section

#: The recall grid of ``pr_curves.csv``.
RECALL_GRID = np.linspace(0, 1, 101)
#: The cleanlab detectors the method's own score is compared with in ``differences.csv`` (those audited).
COMPARED_WITH = ("confident_learning", "knn_confident_learning", "centroid_confident_learning", "datalab")


def audited_runs(params: dict, dataset: str, noise: str, section: dict, layout: Layout) -> list[tuple[str, int]]:
    """``(method, seed)`` of the grid's runs of ``dataset`` and ``noise`` that the section audits (its methods;
    every grid method when it lists none), in the grid's order."""
    methods = [m for m in params["grid"]["methods"] if m in (section["methods"] or params["grid"]["methods"])]
    runs = [(method, seed) for method in methods for seed in params["grid"]["seeds"]]
    for method, seed in runs:
        path = layout.run(dataset, noise, method, seed) / TRAIN_EMBEDDINGS
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; the run's train stage writes it")
    return runs


def pr_curve(score: np.ndarray, noisy: np.ndarray) -> np.ndarray:
    """Interpolated precision (the best precision at any recall at least r) at each r of :data:`RECALL_GRID`."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, _ = precision_recall_curve(noisy, score)
    return np.array([precision[recall >= r].max() for r in RECALL_GRID])


def training_images(prepared: PreparedDataset, ids: np.ndarray) -> list:
    """The images of training rows ``ids`` (uint8 arrays, or the files' paths of a dataset stored as files); a row
    of another split is refused (the audit never looks at one)."""
    split = prepared.manifest["split"].to_numpy()[ids]
    if (split != "train").any():
        raise ValueError(f"sample {int(ids[split != 'train'][0])} is not a training row; the audit shows training "
                         "rows only")
    if prepared.stored_as_files:
        return [prepared.images.paths[int(i)] for i in ids]
    if prepared.decoded_per_batch:  # records: the few rows a page shows, decoded
        return list(prepared.images.decoded(ids))
    return [prepared.images[int(i)] for i in ids]


def audit_setting(params: dict, dataset: str, noise: str, section: dict, layout: Layout = Layout()) -> Path:
    """Audit ``dataset`` at ``noise`` (see the module docstring); ``section``: ``figures.label_audit``, validated."""
    runs = audited_runs(params, dataset, noise, section, layout)
    out = layout.root / AUDIT_ROOT / dataset / noise
    judged, differences, curves, every = [], [], [], {}
    with io.atomic_dir(out) as tmp:
        (tmp / "scores").mkdir()
        for i, (method, seed) in enumerate(runs, start=1):
            folder = layout.run(dataset, noise, method, seed)
            audits = audit_run(folder, section["k"], section["folds"], seed, tuple(section["detectors"]),
                               section["temperature"])
            tag = f"{method}-seed{seed}"
            pd.concat([frame.assign(detector=name) for name, frame in audits.items()]).to_csv(
                tmp / "scores" / f"{tag}.csv", index=False)
            every.update({f"{tag}/{name}": frame for name, frame in audits.items()})
            truth = truth_of(folder)
            rate = estimated_rate(audits)
            if not known_noise(truth):  # nothing known to be wrong: nothing to judge
                print(f"[{i}/{len(runs)}] {folder}: estimated noise rate {rate:.3f}; no label is known to be wrong "
                      "(a clean setting, or data whose truth nobody recorded): nothing judged", flush=True)
                continue
            print(f"[{i}/{len(runs)}] {folder}: estimated noise rate {rate:.3f}, true "
                  f"{truth.dropna().astype(float).mean():.3f} (of the {int(truth.notna().sum())} rows whose truth is "
                  "known)", flush=True)
            table, run_curves, run_differences = judged_run(audits, truth, {"method": method, "seed": seed},
                                                            section["bootstrap_samples"], seed)
            judged.append(table)
            curves.append(run_curves)
            differences += run_differences
        if judged:  # absent where no label is known to be wrong (the clean setting, a dataset of your own)
            pd.concat(judged).to_csv(tmp / "judged.csv", index=False)
            pd.DataFrame(differences).to_csv(tmp / "differences.csv", index=False)
            pd.concat(curves).to_csv(tmp / "pr_curves.csv", index=False, float_format="%.6f")
        if runs:  # one sheet over every audited run's detectors (their consensus): grid runs share their rows
            prepared = PreparedDataset.load(layout.prepared(dataset), layout.root)
            contact_sheet(layout.run(dataset, noise, *runs[0]), prepared, every, tmp / "sheet", section["top"],
                          f"Suspected labels: {dataset}, {noise} ({len(every)} detector runs)")
    return out


def judged_run(audits: dict[str, pd.DataFrame], truth: pd.Series, keys: dict, bootstrap_samples: int, seed: int
               ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """One run's judged rows (:func:`~noisydml.audit.run.judged_table`), precision-recall curves (per detector) and
    bootstrap differences (the method's own score against each of :data:`COMPARED_WITH` audited), each with
    ``keys``; on the rows whose truth is known (``truth``: :func:`~noisydml.audit.run.truth_of`)."""
    known = truth[truth.notna()].astype(bool)  # rows nobody verified are judged neither way
    curves, differences = [], []
    for name, frame in audits.items():
        rows = frame[frame["sample_id"].isin(known.index)]
        curves.append(pd.DataFrame({**keys, "detector": name, "recall": RECALL_GRID, "precision": pr_curve(
            rows["score"].to_numpy(), known.loc[rows["sample_id"]].to_numpy())}))
    if "method" in audits:
        rows = audits["method"][audits["method"]["sample_id"].isin(known.index)]
        noisy = known.loc[rows["sample_id"]].to_numpy()
        for other in (name for name in COMPARED_WITH if name in audits):
            theirs = audits[other].set_index("sample_id").loc[rows["sample_id"], "score"].to_numpy()
            differences += [{**keys, "a": "method", "b": other, "metric": metric,
                             **paired_bootstrap(rows["score"].to_numpy(), theirs, noisy, metric, bootstrap_samples,
                                                seed)} for metric in ("auroc", "auprc")]
    return judged_table(audits, truth).assign(**keys), pd.concat(curves, ignore_index=True), differences


def contact_sheet(run: Path, prepared: PreparedDataset, audits: dict, folder: Path, top: int, title: str) -> Path:
    """The contact sheet of ``audits`` (:func:`~noisydml.audit.sheet.rank_suspects`' consensus) on the rows of run
    folder ``run``, its images from ``prepared`` and its labels named as the run trained on them
    (:func:`~noisydml.audit.run.training_class_names`); returns the page."""
    rows = np.load(run / TRAIN_EMBEDDINGS)
    ids = rows["sample_ids"]
    conflicts = sorted({pair for frame in audits.values() for pair in frame.attrs.get("conflicts", ())})
    return write_sheet(rank_suspects(audits), training_images(prepared, ids), ids, rows["labels"],
                       training_class_names(run).tolist(), folder, top, title=title, conflicts=conflicts)


def audit(params: dict, dataset: str, noise: str, layout: Layout = Layout()) -> Path:
    """The ``audit@<dataset>-<noise>`` stage: ``figures.label_audit`` validated by its study, then
    :func:`audit_setting`."""
    if SECTION not in params["figures"]:
        raise ParamsError(f"figures: missing section {SECTION!r} (no hidden defaults: it is written out in "
                          "params.yaml)")
    section = check_section(params["figures"][SECTION], params)
    if dataset not in section["datasets"]:
        raise ParamsError(f"figures.label_audit.datasets: {section['datasets']} does not hold {dataset!r}; the audit "
                          "stage runs for those datasets only")
    return audit_setting(params, dataset, noise, section, layout)
