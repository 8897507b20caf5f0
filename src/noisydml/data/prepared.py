"""The on-disk form of a prepared dataset, shared by every dataset kind.

A prepared dataset is a folder with

- ``manifest.csv``: ``sample_id, label, class_name, split`` (row ``i`` is sample ``i``) with ``split`` in
  ``train``/``test``, or ``train``/``query``/``gallery`` (In-Shop's protocol); training classes are disjoint
  from the evaluation classes, as in the papers. Datasets with real label noise may add ``is_clean`` (1 verified
  clean, 0 verified noisy, empty unknown);
- the images, stored one of two ways (``info.json``'s ``storage``):

  - ``arrays``: ``images.npy``, ``(N, H, W, C)`` uint8 (the embedded glyphs, small user datasets);
  - ``files``: the manifest adds ``path`` (relative to ``info.json``'s ``images_root``), ``width``, ``height`` and
    ``sha256`` of every image file, decoded per batch when training (:mod:`noisydml.data.images`): nothing
    scales with the dataset in memory;
  - ``records``: the manifest adds ``record`` and ``offset`` (the image's key and byte offset in one MXNet
    RecordIO file, ``info.json``'s ``records_file``: relative to the prepared folder when ``records_in`` is
    ``prepared``, else absolute or relative to the directory the pipeline runs in), decoded per batch
    (:class:`~noisydml.data.images.ImageRecords`): the face sets, whose decoded images would not fit in memory;
- ``info.json``: kind, storage, counts, image shape (arrays, records) and ``images_sha256``, the checksum the runs'
  fingerprints take (of ``images.npy``, of the files' paths and checksums, or of the records file).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from noisydml import io
from noisydml.data import DatasetError

MANIFEST_COLUMNS = ["sample_id", "label", "class_name", "split"]
FILE_COLUMNS = ["path", "width", "height", "sha256"]
RECORD_COLUMNS = ["record", "offset"]
#: Where ``records_file`` lies: in the prepared folder, or where the user's files are (the pipeline's directory).
RECORDS_IN = ("prepared", "base")
#: Allowed ``split`` values; a dataset uses train/test or train/query/gallery.
SPLITS = ("train", "test", "query", "gallery")


def class_order(names) -> list[str]:
    """Class names in label order: numerically when every name is an integer (SOP's 1..22,634: as text, "10"
    would come before "9"), by name otherwise."""
    names = sorted(set(names))
    if all(n.lstrip("-").isdigit() for n in names):
        return sorted(names, key=int)
    return names


def check_split(split: np.ndarray, labels: np.ndarray, class_names: list[str], shared_classes: bool = False) -> None:
    """Per-sample splits must be known values, and no class may be both trained on and evaluated on (unless the
    dataset's protocol shares them: Clothing1M's 14 classes)."""
    bad = sorted(set(split) - set(SPLITS))
    if bad:
        raise DatasetError(f"split {bad[0]!r} is not allowed; allowed: {', '.join(SPLITS)}")
    present = set(split)
    if "test" in present and present & {"query", "gallery"}:
        raise DatasetError("a dataset's evaluation split is either test or query/gallery, not both")
    if bool("query" in present) != bool("gallery" in present):
        raise DatasetError("a query split needs a gallery split and the other way round")
    shared = np.intersect1d(labels[split == "train"], labels[split != "train"])
    if len(shared) and not shared_classes:
        raise DatasetError(f"{len(shared)} classes are in both the training and the evaluation split "
                           f"(first: {class_names[shared[0]]!r}); the papers' splits are class-disjoint")


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


def _manifest(labels: np.ndarray, class_names: list[str], split: np.ndarray | None,
              is_clean: np.ndarray | None, shared_classes: bool = False) -> pd.DataFrame:
    if split is None:
        split = first_half_split(len(class_names))[labels]
    split = np.asarray(split, dtype=object)
    if len(split) != len(labels):
        raise ValueError(f"{len(split)} split values for {len(labels)} images")
    check_split(split, labels, class_names, shared_classes)
    manifest = pd.DataFrame(
        {
            "sample_id": np.arange(len(labels)),
            "label": labels,
            "class_name": [class_names[lab] for lab in labels],
            "split": split,
        }
    )
    if is_clean is not None:
        if len(is_clean) != len(labels):
            raise ValueError(f"{len(is_clean)} is_clean flags for {len(labels)} images")
        manifest["is_clean"] = pd.array(np.where(np.isnan(is_clean), -1, is_clean).astype(int)).astype("Int64")
        manifest.loc[np.isnan(is_clean), "is_clean"] = pd.NA
    return manifest


def _counts(manifest: pd.DataFrame, num_classes: int) -> dict:
    """Samples and classes per split (``num_<split>_samples`` / ``num_<split>_classes``)."""
    out = {"num_samples": int(len(manifest)), "num_classes": num_classes}
    present = [name for name in SPLITS if name in ("train", "test") or (manifest["split"] == name).any()]
    for what, count in (("classes", lambda rows: rows["label"].nunique()), ("samples", len)):
        for name in present:
            out[f"num_{name}_{what}"] = int(count(manifest[manifest["split"] == name]))
    return out


def write_prepared(
    out_dir: str | Path, images: np.ndarray, labels: np.ndarray, class_names: list[str], info: dict,
    is_clean: np.ndarray | None = None, split: np.ndarray | None = None,
) -> dict:
    """Write a prepared dataset folder with its images as arrays, atomically; return its info.

    ``split``: per sample (default: the first half of the classes train, the rest test)."""
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(f"images must be (N, H, W, C) uint8, got {images.shape} {images.dtype}")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    manifest = _manifest(labels, class_names, split, is_clean)
    with io.atomic_dir(out_dir) as tmp:
        np.save(tmp / "images.npy", images)
        manifest.to_csv(tmp / "manifest.csv", index=False)
        info = {
            **info,
            **_counts(manifest, len(class_names)),
            "image_shape": list(images.shape[1:]),
            "images_sha256": sha256_file(tmp / "images.npy"),
        }
        io.write_json(tmp / "info.json", info)
    return info


def write_prepared_files(
    out_dir: str | Path, files: pd.DataFrame, images_root: str, labels: np.ndarray, class_names: list[str],
    info: dict, is_clean: np.ndarray | None = None, split: np.ndarray | None = None, shared_classes: bool = False,
) -> dict:
    """Write a prepared dataset folder whose images stay files, atomically; return its info.

    ``files``: one row per sample with :data:`FILE_COLUMNS` (``path`` relative to ``images_root``, which is
    absolute or relative to the directory the pipeline runs in)."""
    missing = set(FILE_COLUMNS) - set(files.columns)
    if missing:
        raise ValueError(f"files table lacks {sorted(missing)}")
    if len(files) != len(labels):
        raise ValueError(f"{len(files)} files but {len(labels)} labels")
    manifest = _manifest(labels, class_names, split, is_clean, shared_classes)
    for column in FILE_COLUMNS:
        manifest[column] = files[column].to_numpy()
    digest = hashlib.sha256()
    for path, sha in zip(manifest["path"], manifest["sha256"]):
        digest.update(f"{path}\0{sha}\n".encode())
    with io.atomic_dir(out_dir) as tmp:
        manifest.to_csv(tmp / "manifest.csv", index=False)
        info = {**info, "storage": "files", "images_root": str(images_root), **_counts(manifest, len(class_names)),
                "images_sha256": digest.hexdigest()}
        io.write_json(tmp / "info.json", info)
    return info


def write_prepared_records(
    out_dir: str | Path, records_file: str, records_in: str, keys: np.ndarray, offsets: np.ndarray,
    labels: np.ndarray, class_names: list[str], info: dict, image_shape: list[int], images_sha256: str,
    is_clean: np.ndarray | None = None, split: np.ndarray | None = None, extra_files: dict[str, Path] | None = None,
) -> dict:
    """Write a prepared dataset folder whose images stay records of one RecordIO file, atomically; return its info.

    ``records_file``: the file (see the module docstring; ``records_in``: ``prepared`` or ``base``); ``keys`` and
    ``offsets``: each sample's record key and byte offset; ``extra_files``: ``{name: path}`` moved into the folder
    (a ``prepared`` records file among them)."""
    if records_in not in RECORDS_IN:
        raise ValueError(f"records_in {records_in!r}; allowed: {', '.join(RECORDS_IN)}")
    if not (len(keys) == len(offsets) == len(labels)):
        raise ValueError(f"{len(keys)} record keys, {len(offsets)} offsets and {len(labels)} labels")
    manifest = _manifest(labels, class_names, split, is_clean)
    manifest["record"] = np.asarray(keys, np.int64)
    manifest["offset"] = np.asarray(offsets, np.int64)
    with io.atomic_dir(out_dir) as tmp:
        for name, path in (extra_files or {}).items():
            Path(path).replace(tmp / name)
        manifest.to_csv(tmp / "manifest.csv", index=False)
        info = {**info, "storage": "records", "records_file": str(records_file), "records_in": records_in,
                **_counts(manifest, len(class_names)), "image_shape": list(image_shape),
                "images_sha256": images_sha256}
        io.write_json(tmp / "info.json", info)
    return info


@dataclass
class PreparedDataset:
    root: Path
    images: np.ndarray
    manifest: pd.DataFrame
    info: dict

    @classmethod
    def load(cls, root: str | Path, base_dir: str | Path = ".") -> "PreparedDataset":
        """``images`` is a read-only memory map of ``images.npy`` (arrays) or
        :class:`~noisydml.data.images.ImageFiles` of every row (files; ``images_root`` resolved against
        ``base_dir``, the directory the pipeline runs in)."""
        from noisydml.data.images import ImageFiles, ImageRecords

        root = Path(root)
        for name in ("manifest.csv", "info.json"):
            if not (root / name).is_file():
                raise FileNotFoundError(
                    f"{root / name}: missing; run the prepare stage first (dvc repro prepare)"
                )
        info = io.read_json(root / "info.json")
        storage = info.get("storage", "arrays")
        files, records = storage == "files", storage == "records"
        if storage == "arrays" and not (root / "images.npy").is_file():
            raise FileNotFoundError(f"{root / 'images.npy'}: missing; run the prepare stage first (dvc repro prepare)")
        if files:  # class names and paths are text (a class named "NA" or "1" stays what it is)
            manifest = pd.read_csv(root / "manifest.csv", keep_default_na=False,
                                   dtype={"class_name": str, "path": str, "sha256": str},
                                   na_values={"is_clean": [""]})
        elif records:  # millions of rows: names and splits as categories, the index as int64 (no string per row)
            manifest = pd.read_csv(root / "manifest.csv", keep_default_na=False, na_values={"is_clean": [""]},
                                   dtype={"class_name": "category", "split": "category", "record": np.int64,
                                          "offset": np.int64, "sample_id": np.int64, "label": np.int64})
        else:
            manifest = pd.read_csv(root / "manifest.csv")
        needed = MANIFEST_COLUMNS + (FILE_COLUMNS if files else RECORD_COLUMNS if records else [])
        missing = set(needed) - set(manifest.columns)
        if missing:
            raise ValueError(f"{root / 'manifest.csv'}: missing columns {sorted(missing)}")
        if not np.array_equal(manifest["sample_id"].to_numpy(), np.arange(len(manifest))):
            raise ValueError(f"{root / 'manifest.csv'}: sample ids must be 0..N-1 in row order")
        if files:
            images_root = Path(base_dir) / info["images_root"]
            images = ImageFiles([str(images_root / p) for p in manifest["path"]], manifest["sample_id"].to_numpy())
        elif records:
            rec = (root if info["records_in"] == "prepared" else Path(base_dir)) / info["records_file"]
            if not rec.is_file():
                raise FileNotFoundError(f"{rec}: missing (the records file {root / 'info.json'} names); "
                                        "run the prepare stage again (dvc repro prepare)")
            images = ImageRecords(rec, manifest["offset"].to_numpy(), manifest["sample_id"].to_numpy(),
                                  info["image_shape"][0])
        else:
            images = np.load(root / "images.npy", mmap_mode="r")
        if len(manifest) != len(images):
            raise ValueError(
                f"{root}: manifest has {len(manifest)} rows but images.npy has {len(images)} images"
            )
        return cls(root, images, manifest, info)

    @property
    def stored_as_files(self) -> bool:
        return self.info.get("storage", "arrays") == "files"

    @property
    def decoded_per_batch(self) -> bool:
        """Images stay on disk (files or records) and are decoded when a batch needs them."""
        return self.info.get("storage", "arrays") in ("files", "records")

    def split(self, name: str) -> pd.DataFrame:
        return self.manifest[self.manifest["split"] == name].reset_index(drop=True)


def train_split(prepared_dir: Path, base_dir: str | Path = "."):
    """The training part of a prepared dataset, labels mapped to 0..C-1 (in class order)."""
    ds = PreparedDataset.load(prepared_dir, base_dir)
    train = ds.split("train")
    classes = np.sort(train["label"].unique())
    dense = np.searchsorted(classes, train["label"].to_numpy())
    return ds, train, dense
