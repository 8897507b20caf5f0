"""The data of one training run: images, the labels it trains on, and the ground truth kept from the method."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from noisydml import io
from noisydml.data import DatasetError
from noisydml.data.prepared import sha256_file, train_split
from noisydml.engine.judge import GroundTruth, group_majorities
from noisydml.engine.types import ImageSet
from noisydml.pipeline.layout import Layout


def check_features_fresh(stats: dict, layout: Layout) -> None:
    """Noisy labels made from a run's embeddings must come from that run's current embeddings.

    In ``dvc repro`` the stage ``corrupt_from_run@<dataset>-<noise>`` depends on the run's folder, so DVC
    re-makes the labels when the run is retrained; this guard also stops a training started by hand
    (``python stages/train.py``) on labels made from an older model.
    """
    feats = stats.get("features") or {}
    if feats.get("source") != "run":
        return
    path = layout.root / feats["path"]
    if not path.is_file() or sha256_file(path) != feats["sha256"]:
        raise DatasetError(
            f"noisy labels {stats['dataset']}/{stats['noise']} were made from the embeddings of run {feats['run']}, "
            f"which have changed (or gone) since; `dvc repro` re-makes them (stage corrupt_from_run@"
            f"{stats['dataset']}-{stats['noise']}) before training on them"
        )


def load_noisy_labels(path: Path, train_sample_ids: np.ndarray) -> pd.DataFrame:
    table = pd.read_csv(path / "labels.csv")
    if not np.array_equal(table["sample_id"].to_numpy(), train_sample_ids):
        raise DatasetError(
            f"{path / 'labels.csv'}: its sample ids do not match the prepared dataset's training split; "
            "re-run the corrupt stage (dvc repro)"
        )
    return table


def ground_truth(noisy: pd.DataFrame, per_class: pd.DataFrame) -> GroundTruth:
    """Truth of every training row, true classes in training-label ids (-1: a class dissolved by the noise)."""
    to_label = dict(zip(per_class["true_label"], per_class["label"]))
    true_label = noisy["true_label"].map(to_label).fillna(-1).to_numpy(np.int64)
    known = noisy["verified"].to_numpy().astype(bool) if "verified" in noisy else np.ones(len(noisy), bool)
    return GroundTruth(noisy["is_noisy"].to_numpy().astype(bool), true_label, known)


@dataclass
class RunData:
    """The training and test images of one (dataset, noise setting), as the trainer takes them."""

    train_rows: pd.DataFrame  # the whole training split (manifest rows)
    test_rows: pd.DataFrame
    noisy: pd.DataFrame       # labels.csv of the noise setting, row i = train_rows row i
    train_set: ImageSet       # what is trained on
    test_set: ImageSet
    truth: GroundTruth        # of train_set's rows: for the trainer's scores only, never for the method
    sample_ids: np.ndarray    # manifest ids of train_set's rows
    fingerprint: str          # images checksum + noisy labels digest
    #: Rows of train_rows trained on / held out for validation (``train.validation_classes``).
    fit_index: np.ndarray | None = None
    val_index: np.ndarray | None = None
    val_set: ImageSet | None = None
    #: Images of every row of train_rows (held-out and chain-excluded ones too).
    train_images: np.ndarray | None = None


def validation_split(labels: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    """Rows whose (noisy) label is one of ``num_classes`` classes drawn by ``seed``: the same for every method."""
    classes = np.unique(labels)
    held = np.random.default_rng([seed, 7]).choice(classes, size=num_classes, replace=False)
    return np.isin(labels, held)


def load_run_data(dataset: str, noise: str, layout: Layout, validation_classes: int = 0, seed: int = 0) -> RunData:
    ds, train_rows, _ = train_split(layout.prepared(dataset), layout.root)
    check_features_fresh(io.read_json(layout.noisy(dataset, noise) / "stats.json"), layout)
    noisy = load_noisy_labels(layout.noisy(dataset, noise), train_rows["sample_id"].to_numpy())
    truth = ground_truth(noisy, pd.read_csv(layout.noisy(dataset, noise) / "per_class.csv"))
    test_rows = ds.split("test")
    query_mask = None
    if (ds.manifest["split"] == "query").any():  # In-Shop's protocol: queries searched against a gallery
        test_rows = ds.manifest[ds.manifest["split"].isin(["query", "gallery"])].reset_index(drop=True)
        query_mask = (test_rows["split"] == "query").to_numpy()
    # arrays are read into memory (small); files and records stay on disk, decoded per batch
    images = ds.images if ds.decoded_per_batch else np.asarray(ds.images)
    train_images = images[train_rows["sample_id"].to_numpy()]
    labels = noisy["label"].to_numpy()
    sample_ids = train_rows["sample_id"].to_numpy()
    test_set = ImageSet(images[test_rows["sample_id"].to_numpy()], test_rows["label"].to_numpy(), query_mask)
    labels_digest = pd.util.hash_pandas_object(noisy[["sample_id", "label", "true_label", "is_noisy"]],
                                               index=False).sum()
    fingerprint = f"{ds.info['images_sha256']}:{int(labels_digest)}"
    if not validation_classes:
        return RunData(train_rows, test_rows, noisy, ImageSet(train_images, labels), test_set, truth, sample_ids,
                       fingerprint, train_images=train_images)
    num_labels = len(np.unique(labels))
    if validation_classes >= num_labels:
        raise DatasetError(f"train.validation_classes: {validation_classes} held out, but {dataset}/{noise}'s "
                           f"training labels have only {num_labels} classes")
    held = validation_split(labels, validation_classes, seed)
    fit_index, val_index = np.flatnonzero(~held), np.flatnonzero(held)
    kept_labels, fit_labels = np.unique(labels[fit_index], return_inverse=True)  # renumbered 0..K-1
    fit_truth = truth.subset(fit_index)
    # true classes in the renumbered ids; a true class held out for validation is not trained on: -1
    renumber = np.full(int(labels.max()) + 2, -1, np.int64)
    renumber[kept_labels] = np.arange(len(kept_labels))
    fit_truth.true_label = np.where(fit_truth.true_label >= 0, renumber[fit_truth.true_label], -1)
    return RunData(train_rows, test_rows, noisy, ImageSet(train_images[fit_index], fit_labels), test_set,
                   fit_truth, sample_ids[fit_index], f"{fingerprint}:val{validation_classes}", fit_index, val_index,
                   ImageSet(train_images[val_index], labels[val_index]), train_images)


def cluster_truth(clusters: np.ndarray, truth: GroundTruth) -> GroundTruth:
    """Ground truth of rows labelled by cluster ids (``labels.kind: clusters``): a row is noisy when its true class
    is not its cluster's majority true class; its "true label" is the largest cluster whose majority is its
    true class (-1: none), so pseudo-label scores keep their meaning. Majorities count known rows only."""
    true = truth.true_label
    ok = truth.known.astype(bool) & (true >= 0)
    width = int(true.max(initial=0)) + 1
    majority, _ = group_majorities(clusters[ok], true[ok], num_groups=int(clusters.max()) + 1)
    sizes = np.bincount(clusters, minlength=len(majority))
    home = np.full(width, -1, np.int64)
    for c in np.argsort(sizes, kind="stable"):  # ascending: the largest cluster of a class is written last
        if majority[c] >= 0:
            home[majority[c]] = c
    return GroundTruth(majority[clusters] != true, np.where(true >= 0, home[np.maximum(true, 0)], -1), truth.known)


def take_upstream(data: RunData, upstream_dir: Path, labels: dict, inputs: list[str], where: str):
    """Apply what a chained run takes from its upstream's exports (``exports.npz``, keyed by sample id).

    ``labels.label``: train on that export's labels (training-label ids, -1 = no label: the sample is left out);
    ``labels.keep``: train only on samples whose export is 1 (left-out samples are never drawn by the sampler).
    Ground truth follows: a sample is noisy when the label it now trains on is not its true class.
    Returns ``(data, inputs by name aligned with the kept rows, sha256 of exports.npz or None)``.
    """
    needed = [n for n in (labels["label"], labels["keep"], *inputs) if n]
    if not needed:
        return data, {}, None
    path = upstream_dir / "exports.npz"
    if not path.is_file():
        raise DatasetError(f"{where}: {path} is missing: the upstream run exports nothing; it must be trained by a "
                           "method whose export() writes " + ", ".join(repr(n) for n in needed))
    exported = dict(np.load(path))
    missing = [n for n in needed if n not in exported]
    if missing:
        raise DatasetError(f"{where}: the upstream exports {sorted(k for k in exported if k != 'sample_id')}, "
                           f"not {missing}")
    position = pd.Series(np.arange(len(exported["sample_id"])), index=exported["sample_id"])
    rows = position.reindex(data.sample_ids).to_numpy()
    if np.isnan(rows).any():
        raise DatasetError(f"{where}: {path} has no value for {int(np.isnan(rows).sum())} training samples")
    rows = rows.astype(np.int64)
    labels_now = data.train_set.labels.copy()
    if labels["label"]:
        labels_now = exported[labels["label"]][rows].astype(np.int64)
    keep = labels_now >= 0
    if labels["keep"]:
        keep &= exported[labels["keep"]][rows] > 0.5
    if keep.sum() == 0:
        raise DatasetError(f"{where}: the upstream's exports keep no training sample")
    kept_classes, dense = np.unique(labels_now[keep], return_inverse=True)
    truth = data.truth.subset(np.flatnonzero(keep))
    if labels["kind"] == "clusters":
        truth = cluster_truth(dense, truth)
    else:
        renumber = np.full(max(int(kept_classes.max()), int(truth.true_label.max(initial=0))) + 2, -1, np.int64)
        renumber[kept_classes] = np.arange(len(kept_classes))
        truth.true_label = np.where(truth.true_label >= 0, renumber[truth.true_label], -1)
        if labels["label"]:
            truth.is_noisy = dense != truth.true_label
    taken = {name: exported[name][rows][keep] for name in inputs}
    train_set = ImageSet(data.train_set.images[keep], dense)
    digest = sha256_file(path)
    data = RunData(data.train_rows, data.test_rows, data.noisy, train_set, data.test_set, truth,
                   data.sample_ids[keep], f"{data.fingerprint}:upstream:{digest}", data.fit_index, data.val_index,
                   data.val_set, data.train_images)
    return data, taken, digest


def load_upstream(chain: dict, data: RunData, upstream_dir: Path, root: Path, where: str):
    """What a chained run (``chain``: its entry of ``chains``) takes from its upstream's folder ``upstream_dir``
    (``model.pt``, ``exports.npz``): ``(data with its labels and kept samples, inputs, initial state, the
    upstream's record)``; the record names the folder relative to ``root`` and its files' sha256."""
    import torch

    if not (upstream_dir / "model.pt").is_file():
        raise FileNotFoundError(f"{where}: the upstream run {upstream_dir} is not trained yet; `dvc repro` "
                                "trains it first (the chain's stage depends on it)")
    data, inputs, exports_sha = take_upstream(data, upstream_dir, chain["labels"], chain["inputs"], where)
    init_state = None
    if chain["init"]["model"] or chain["init"]["method"]:
        saved = torch.load(upstream_dir / "model.pt", map_location="cpu", weights_only=False)
        init_state = {"model": saved["model"] if chain["init"]["model"] else None,
                      "method": saved["method"] if chain["init"]["method"] else None}
    upstream = {"run": str(upstream_dir.relative_to(root)), "model_sha256": sha256_file(upstream_dir / "model.pt"),
                "exports_sha256": exports_sha, "init": chain["init"], "labels": chain["labels"],
                "inputs": chain["inputs"]}
    return data, inputs, init_state, upstream
