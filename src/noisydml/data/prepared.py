"""The on-disk form of a prepared dataset, shared by every dataset kind.

A prepared dataset is a folder with

- ``images.npy``: ``(N, H, W, C)`` uint8, row ``i`` is sample ``i``;
- ``manifest.csv``: ``sample_id, label, class_name, split`` with ``split`` in
  ``train``/``test``; classes are disjoint between the splits, as in the papers.
  Datasets with real label noise may add ``is_clean`` (1 verified clean,
  0 verified noisy, empty unknown);
- ``info.json``: kind, counts, image shape and the checksum of ``images.npy``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from noisydml import io

MANIFEST_COLUMNS = ["sample_id", "label", "class_name", "split"]


def first_half_split(num_classes: int) -> np.ndarray:
    """Split label -> "train"/"test": the first half of the classes train, as in the papers."""
    n_train = num_classes // 2
    return np.where(np.arange(num_classes) < n_train, "train", "test")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_prepared(
    out_dir: str | Path, images: np.ndarray, labels: np.ndarray, class_names: list[str], info: dict,
    is_clean: np.ndarray | None = None,
) -> dict:
    """Write a prepared dataset folder atomically; return its info."""
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(f"images must be (N, H, W, C) uint8, got {images.shape} {images.dtype}")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    num_classes = len(class_names)
    split_of_class = first_half_split(num_classes)
    manifest = pd.DataFrame(
        {
            "sample_id": np.arange(len(labels)),
            "label": labels,
            "class_name": [class_names[lab] for lab in labels],
            "split": split_of_class[labels],
        }
    )
    if is_clean is not None:
        if len(is_clean) != len(labels):
            raise ValueError(f"{len(is_clean)} is_clean flags for {len(labels)} images")
        manifest["is_clean"] = pd.array(np.where(np.isnan(is_clean), -1, is_clean).astype(int)).astype("Int64")
        manifest.loc[np.isnan(is_clean), "is_clean"] = pd.NA
    with io.atomic_dir(out_dir) as tmp:
        np.save(tmp / "images.npy", images)
        manifest.to_csv(tmp / "manifest.csv", index=False)
        info = {
            **info,
            "num_samples": int(len(labels)),
            "num_classes": num_classes,
            "num_train_classes": int((split_of_class == "train").sum()),
            "num_test_classes": int((split_of_class == "test").sum()),
            "num_train_samples": int((manifest["split"] == "train").sum()),
            "num_test_samples": int((manifest["split"] == "test").sum()),
            "image_shape": list(images.shape[1:]),
            "images_sha256": sha256_file(tmp / "images.npy"),
        }
        io.write_json(tmp / "info.json", info)
    return info


@dataclass
class PreparedDataset:
    root: Path
    images: np.ndarray
    manifest: pd.DataFrame
    info: dict

    @classmethod
    def load(cls, root: str | Path) -> "PreparedDataset":
        root = Path(root)
        for name in ("images.npy", "manifest.csv", "info.json"):
            if not (root / name).is_file():
                raise FileNotFoundError(
                    f"{root / name}: missing; run the prepare stage first (dvc repro prepare)"
                )
        images = np.load(root / "images.npy", mmap_mode="r")
        manifest = pd.read_csv(root / "manifest.csv")
        missing = set(MANIFEST_COLUMNS) - set(manifest.columns)
        if missing:
            raise ValueError(f"{root / 'manifest.csv'}: missing columns {sorted(missing)}")
        if len(manifest) != len(images):
            raise ValueError(
                f"{root}: manifest has {len(manifest)} rows but images.npy has {len(images)} images"
            )
        return cls(root, images, manifest, io.read_json(root / "info.json"))

    def split(self, name: str) -> pd.DataFrame:
        return self.manifest[self.manifest["split"] == name].reset_index(drop=True)


def train_split(prepared_dir: Path):
    """The training part of a prepared dataset, labels mapped to 0..C-1 (in class order)."""
    ds = PreparedDataset.load(prepared_dir)
    train = ds.split("train")
    classes = np.sort(train["label"].unique())
    dense = np.searchsorted(classes, train["label"].to_numpy())
    return ds, train, dense
