"""The audit of one trained run: every detector on its training rows, in the audit schema, and their judged table.

Reads the run folder only: ``train_embeddings.npz`` (the final model's embeddings of the training rows, their given
labels and, where the corrupt stage knows it, their true labels) and ``decisions.npz`` (the method's own). Never the
test split.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.audit import DEFAULT_DETECTORS, DETECTORS, detectors
from noisydml.audit.judge import judge

#: Where the noise-rate estimate comes from (their probes' probabilities), in order of preference.
ESTIMATED_BY = ("confident_learning", "centroid_confident_learning", "knn_confident_learning")


def audit_run(run_dir: str | Path, k: int = 10, folds: int = 5, seed: int = 0,
              detectors_used: tuple[str, ...] = DEFAULT_DETECTORS,
              temperature: float = detectors.CENTROID_TEMPERATURE) -> dict[str, pd.DataFrame]:
    """Detector name -> its scores (audit schema, labels as the run's training-label ids): ``method`` (the run's own
    decisions, where it made any) and ``detectors_used`` (of :data:`DETECTORS`). Each frame carries
    ``attrs['seconds']`` and ``attrs['peak_mib']`` (Python-side allocations, tracemalloc's) of its detector; the
    confident-learning ones ``attrs['estimated_noise_rate']`` (:func:`estimated_rate`)."""
    unknown = [name for name in detectors_used if name not in DETECTORS]
    if unknown or not detectors_used:
        raise ValueError(f"detectors {list(detectors_used)}: allowed a non-empty list of {', '.join(DETECTORS)}")
    run_dir = Path(run_dir)
    rows = np.load(run_dir / "train_embeddings.npz")
    sample_id, given, emb = rows["sample_ids"], rows["labels"].astype(np.int64), rows["embeddings"]
    classes, dense = np.unique(given, return_inverse=True)  # cleanlab wants labels 0..C-1

    def back(frame: pd.DataFrame) -> pd.DataFrame:
        frame["given_label"] = classes[frame["given_label"].to_numpy()]
        s = frame["suggested_label"].to_numpy()
        frame["suggested_label"] = np.where(s >= 0, classes[np.maximum(s, 0)], -1)
        if "conflicts" in frame.attrs:
            frame.attrs["conflicts"] = [(a, b, int(classes[la]), int(classes[lb]))
                                        for a, b, la, lb in frame.attrs["conflicts"]]
        return frame

    out: dict[str, pd.DataFrame] = {}

    def timed(name, fn):
        tracemalloc.start()
        t0 = time.perf_counter()
        frame = fn()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        if frame is not None:
            frame.attrs.update(seconds=seconds, peak_mib=peak)
            out[name] = frame

    def probe():
        probs = detectors.cross_fitted_probabilities(emb, dense, folds, seed)
        frame = back(detectors.confident_learning(probs, dense, sample_id))
        frame.attrs["estimated_noise_rate"] = detectors.estimated_noise_rate(probs, dense)
        return frame

    if (run_dir / "decisions.npz").is_file():
        saved = dict(np.load(run_dir / "decisions.npz"))
        timed("method", lambda: detectors.method_decisions(saved, sample_id, given))
    runners = {"datalab": lambda: back(detectors.datalab(emb, dense, sample_id, k)),
               "confident_learning": probe,
               "knn_confident_learning": lambda: back(detectors.knn_confident_learning(emb, dense, sample_id, k)),
               "centroid_confident_learning": lambda: back(detectors.centroid_confident_learning(
                   emb, dense, sample_id, folds, seed, temperature)),
               "knn_disagreement": lambda: back(detectors.knn_disagreement(emb, dense, sample_id, k)),
               "open_set": lambda: back(detectors.open_set(emb, dense, sample_id, folds, seed))}
    for name in detectors_used:
        timed(name, runners[name])
    return out


def estimated_rate(audits: dict[str, pd.DataFrame]) -> float:
    """The audit's estimate of the noise rate (:func:`noisydml.audit.estimate.from_probability_of_label`) from the
    probabilities of its confident-learning detector (:data:`ESTIMATED_BY`, the
    first audited); NaN when neither ran."""
    return next((float(audits[name].attrs["estimated_noise_rate"]) for name in ESTIMATED_BY if name in audits),
                float("nan"))


def noise_folder(run_dir: str | Path) -> Path:
    """``data/noisy/<dataset>/<noise>`` of a run folder ``runs/<dataset>/<noise>/<run>/seed<k>`` (beside ``runs/``):
    the corrupt stage's label table and per-class table."""
    run_dir = Path(run_dir).resolve()
    return run_dir.parents[4] / "data" / "noisy" / run_dir.parents[2].name / run_dir.parents[1].name


def truth_of(run_dir: str | Path) -> pd.Series:
    """Per training sample id, whether its label is wrong (nullable: NA where nobody knows): the corrupt stage's
    ``is_noisy`` of the run's dataset and noise (``data/noisy/<dataset>/<noise>/labels.csv`` beside ``runs/``). On
    a dataset with verification flags (the prepared manifest's ``is_clean``: Food-101N's verified subset) only
    the verified rows are known; the others are NA, so they are judged neither right nor wrong. On data without
    known noise (a ``folder`` dataset of your own) it is all False: nothing to judge against."""
    folder = noise_folder(run_dir)
    path = folder / "labels.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; the corrupt stage writes it (dvc repro corrupt@...)")
    labels = pd.read_csv(path)
    truth = pd.Series(pd.array(labels["is_noisy"].to_numpy(bool), dtype="boolean"),
                      index=labels["sample_id"].to_numpy())
    manifest = folder.parents[2] / "prepared" / folder.parent.name / "manifest.csv"
    if manifest.is_file() and "is_clean" in pd.read_csv(manifest, nrows=0).columns:
        flags = pd.read_csv(manifest, usecols=["sample_id", "is_clean"], dtype={"is_clean": "Int64"})
        verified = flags.set_index("sample_id")["is_clean"].reindex(truth.index).notna().to_numpy()
        truth[~verified] = pd.NA
    return truth


def known_noise(truth: pd.Series) -> bool:
    """Whether some label is known to be wrong (there is something to judge against)."""
    return bool(truth.fillna(False).any())


def training_class_names(run_dir: str | Path) -> pd.Series:
    """Training label id (the ids the run trained on) -> class name, from the corrupt stage's per-class table.
    Not the manifest's ids: small-cluster noise removes classes and renumbers the rest. A label with no class of
    the dataset behind it (an open-set distractor's) is named ``label <id>``."""
    folder = noise_folder(run_dir)
    per_class = pd.read_csv(folder / "per_class.csv", dtype={"class_name": str})
    names = per_class[per_class["label"] >= 0].set_index("label")["class_name"]
    used = np.unique(pd.read_csv(folder / "labels.csv")["label"].to_numpy())
    return pd.Series([names.get(k, f"label {k}") for k in used], index=used).reindex(
        np.arange(int(used.max()) + 1), fill_value="")


def judged_table(audits: dict[str, pd.DataFrame], is_noisy: pd.Series) -> pd.DataFrame:
    """One row per detector: :func:`noisydml.audit.judge.judge` against ``is_noisy`` (per sample id; the corrupt
    stage's truth, :func:`truth_of`) on the rows whose truth is known (``rows``: how many), its seconds, peak MiB and,
    for a confident-learning detector, its estimate of the noise rate (NaN for the others)."""
    table = []
    for name, frame in audits.items():
        truth = is_noisy.loc[frame["sample_id"].to_numpy()]
        known = truth.notna().to_numpy()  # rows nobody verified are judged neither way
        table.append({"detector": name, **judge(frame[known], truth[known].to_numpy(bool)),
                      "seconds": frame.attrs.get("seconds"), "peak_mib": frame.attrs.get("peak_mib"),
                      "estimated_noise_rate": frame.attrs.get("estimated_noise_rate", np.nan)})
    return pd.DataFrame(table)
