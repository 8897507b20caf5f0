"""The ``folder`` dataset kind: a user's own images.

Either ``root`` holds one sub-folder per class (the folder name is the class
name), or ``csv`` lists ``path,label`` rows (paths relative to the CSV's
folder). A CSV may add an ``is_clean`` column for data with real label noise:
``1`` for a label verified correct, ``0`` for one verified wrong, empty where
unknown (Food-101N's verification flags are of this form); the flags reach
the manifest and the ``none`` noise kind's statistics. A CSV may also add a
``split`` column (``train``/``test``, or ``train``/``query``/``gallery``): a
dataset's official split; without it the first half of the classes train and
the second half test. Classes are sorted by name, numerically when every name
is an integer.

``storage: arrays`` decodes every image once, resizes it to ``image_size`` and
packs them into ``images.npy``; ``storage: files`` keeps the files where they
are and writes a manifest of their paths, sizes and sha256 (decoded and
verified in parallel, ``runtime.prepare_workers`` processes), for datasets too
large for memory: they are decoded per batch when training
(:mod:`noisydml.data.images`). See :mod:`noisydml.data.prepared`.

Every problem (a missing file, an image PIL cannot read, a class folder with
no images, a class with a single image) stops with an error naming the file.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from io import BytesIO
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from noisydml.data import DatasetError
from noisydml.data.prepared import SPLITS, class_order

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


NO_FLAG = float("nan")


def list_folder(root: Path) -> list[tuple[Path, str, float, str]]:
    if not root.is_dir():
        raise DatasetError(f"folder dataset: root {root} is not a folder")
    items: list[tuple[Path, str]] = []
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise DatasetError(f"folder dataset: {root} has no class sub-folders")
    for class_dir in class_dirs:
        files = sorted(
            p for p in class_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise DatasetError(
                f"folder dataset: class folder {class_dir} is empty (no files ending in "
                f"{', '.join(sorted(IMAGE_SUFFIXES))})"
            )
        items.extend((f, class_dir.name, NO_FLAG, "") for f in files)
    return items


def list_csv(csv_path: Path) -> list[tuple[Path, str, float, str]]:
    if not csv_path.is_file():
        raise DatasetError(f"folder dataset: csv {csv_path} does not exist")
    table = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    if list(table.columns[:2]) != ["path", "label"]:
        raise DatasetError(f"folder dataset: {csv_path} must start with the columns path,label; got {list(table.columns)}")
    flags = table["is_clean"] if "is_clean" in table.columns else [""] * len(table)
    splits = table["split"] if "split" in table.columns else [""] * len(table)
    items = []
    for row, (path, label, flag, split) in enumerate(zip(table["path"], table["label"], flags, splits), start=2):
        if not path or not label:
            raise DatasetError(f"folder dataset: {csv_path} line {row}: empty path or label")
        if flag not in ("", "0", "1"):
            raise DatasetError(
                f"folder dataset: {csv_path} line {row}: is_clean is {flag!r}; allowed: 1 (verified clean), "
                "0 (verified noisy) or empty (unknown)"
            )
        if "split" in table.columns and split not in SPLITS:
            raise DatasetError(f"folder dataset: {csv_path} line {row}: split is {split!r}; allowed: "
                               f"{', '.join(SPLITS)}")
        p = Path(path)
        items.append((p if p.is_absolute() else csv_path.parent / p, label, float(flag) if flag else NO_FLAG, split))
    if not items:
        raise DatasetError(f"folder dataset: {csv_path} lists no images")
    return items


def load_image(path: Path, image_size: int, channels: int) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(f"folder dataset: image {path} does not exist")
    try:
        with Image.open(path) as img:
            img = img.convert("L" if channels == 1 else "RGB")
            img = img.resize((image_size, image_size), Image.Resampling.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DatasetError(f"folder dataset: cannot read image {path}: {e}") from e
    return arr.reshape(image_size, image_size, channels)


def list_items(cfg: dict, base_dir: Path):
    """``(items, class_names, images_root)`` of a folder dataset config, items ordered by (class, path)."""
    if cfg.get("csv"):
        items = list_csv((base_dir / cfg["csv"]).resolve())
        images_root = str(Path(cfg["csv"]).parent)
    else:
        items = list_folder((base_dir / cfg["root"]).resolve())
        images_root = cfg["root"]
    class_names = class_order(it[1] for it in items)
    counts = pd.Series([it[1] for it in items]).value_counts()
    lonely = counts[counts < 2]
    if len(lonely):
        name = lonely.index[0]
        example = next(it[0] for it in items if it[1] == name)
        raise DatasetError(
            f"folder dataset: class {name!r} has a single image ({example}); metric learning needs "
            "at least 2 images per class"
        )
    if len(class_names) < 4:
        raise DatasetError(
            f"folder dataset: {len(class_names)} classes found; at least 4 are needed (half train, half test)"
        )
    index = {name: i for i, name in enumerate(class_names)}
    # Order samples by class so sample ids follow the class order, as in glyphs.
    items.sort(key=lambda it: (index[it[1]], str(it[0])))
    given = {it[3] for it in items}
    if "" in given and len(given) > 1:
        raise DatasetError("folder dataset: the csv's split column is empty on some rows; give every row a split "
                           "or drop the column")
    return items, class_names, images_root


def _split_of(items) -> np.ndarray | None:
    return None if items[0][3] == "" else np.array([it[3] for it in items], dtype=object)


def _flags_of(items) -> np.ndarray | None:
    is_clean = np.array([it[2] for it in items], dtype=float)
    return None if np.isnan(is_clean).all() else is_clean


def load_folder_dataset(cfg: dict, base_dir: Path, desc: str = "reading images"):
    """Return ``(images, labels, class_names, is_clean, split)`` for a folder dataset config (``storage: arrays``).

    ``is_clean`` is None unless a CSV gives verification flags; ``split`` None unless it gives splits.
    """
    items, class_names, _ = list_items(cfg, base_dir)
    index = {name: i for i, name in enumerate(class_names)}
    size, channels = cfg["image_size"], cfg["channels"]
    images = np.empty((len(items), size, size, channels), np.uint8)
    for i, item in enumerate(tqdm(items, desc=desc, unit="img")):
        images[i] = load_image(item[0], size, channels)
    labels = np.array([index[it[1]] for it in items], dtype=np.int64)
    return images, labels, class_names, _flags_of(items), _split_of(items)


def verify_image(path: Path) -> tuple[int, int, str]:
    """``(width, height, sha256)`` of an image file, fully decoded once (a truncated file fails here, not in the
    middle of training)."""
    if not path.is_file():
        raise DatasetError(f"folder dataset: image {path} does not exist")
    data = path.read_bytes()
    try:
        with Image.open(BytesIO(data)) as img:
            img.load()
            width, height = img.size
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DatasetError(f"folder dataset: cannot read image {path}: {e}") from e
    return width, height, hashlib.sha256(data).hexdigest()


def verify_images(paths: list[Path], workers: int, desc: str) -> list[tuple[int, int, str]]:
    """:func:`verify_image` of every path, in ``workers`` processes (0: one per CPU core), in order."""
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(paths) < 64:
        return [verify_image(p) for p in tqdm(paths, desc=desc, unit="img")]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        chunk = max(1, min(256, len(paths) // (workers * 8)))
        return list(tqdm(pool.map(verify_image, paths, chunksize=chunk), total=len(paths), desc=desc, unit="img"))


def scan_folder_dataset(cfg: dict, base_dir: Path, workers: int = 0, desc: str = "verifying images"):
    """Return ``(files, images_root, labels, class_names, is_clean, split)`` for ``storage: files``: ``files`` has
    the manifest's file columns (``path`` relative to ``images_root``)."""
    items, class_names, images_root = list_items(cfg, base_dir)
    index = {name: i for i, name in enumerate(class_names)}
    root = (base_dir / images_root).resolve()
    paths = [it[0] for it in items]
    checked = verify_images(paths, workers, desc)
    files = pd.DataFrame({
        "path": [os.path.relpath(p, root) if p.is_relative_to(root) else str(p) for p in paths],
        "width": [c[0] for c in checked], "height": [c[1] for c in checked], "sha256": [c[2] for c in checked],
    })
    labels = np.array([index[it[1]] for it in items], dtype=np.int64)
    return files, images_root, labels, class_names, _flags_of(items), _split_of(items)
