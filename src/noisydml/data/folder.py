"""The ``folder`` dataset kind: a user's own images.

Either ``root`` holds one sub-folder per class (the folder name is the class
name), or ``csv`` lists ``path,label`` rows (paths relative to the CSV's
folder). A CSV may add an ``is_clean`` column for data with real label noise:
``1`` for a label verified correct, ``0`` for one verified wrong, empty where
unknown (Food-101N's verification flags are of this form); the flags reach
the manifest and the ``none`` noise kind's statistics. Images are decoded once, resized to ``image_size`` and packed into
the prepared form (see :mod:`noisydml.data.prepared`). Classes are sorted by
name; the first half train, the second half test.

Every problem (a missing file, an image PIL cannot read, a class folder with
no images, a class with a single image) stops with an error naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from noisydml.data import DatasetError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


NO_FLAG = float("nan")


def list_folder(root: Path) -> list[tuple[Path, str, float]]:
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
        items.extend((f, class_dir.name, NO_FLAG) for f in files)
    return items


def list_csv(csv_path: Path) -> list[tuple[Path, str, float]]:
    if not csv_path.is_file():
        raise DatasetError(f"folder dataset: csv {csv_path} does not exist")
    table = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    if list(table.columns[:2]) != ["path", "label"]:
        raise DatasetError(f"folder dataset: {csv_path} must start with the columns path,label; got {list(table.columns)}")
    flags = table["is_clean"] if "is_clean" in table.columns else [""] * len(table)
    items = []
    for row, (path, label, flag) in enumerate(zip(table["path"], table["label"], flags), start=2):
        if not path or not label:
            raise DatasetError(f"folder dataset: {csv_path} line {row}: empty path or label")
        if flag not in ("", "0", "1"):
            raise DatasetError(
                f"folder dataset: {csv_path} line {row}: is_clean is {flag!r}; allowed: 1 (verified clean), "
                "0 (verified noisy) or empty (unknown)"
            )
        p = Path(path)
        items.append((p if p.is_absolute() else csv_path.parent / p, label, float(flag) if flag else NO_FLAG))
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


def load_folder_dataset(cfg: dict, base_dir: Path, desc: str = "reading images"):
    """Return ``(images, labels, class_names, is_clean)`` for a folder dataset config.

    ``is_clean`` is None unless a CSV gives verification flags.
    """
    if cfg.get("csv"):
        items = list_csv((base_dir / cfg["csv"]).resolve())
    else:
        items = list_folder((base_dir / cfg["root"]).resolve())
    class_names = sorted({it[1] for it in items})
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
    size, channels = cfg["image_size"], cfg["channels"]
    images = np.empty((len(items), size, size, channels), np.uint8)
    for i, item in enumerate(tqdm(items, desc=desc, unit="img")):
        images[i] = load_image(item[0], size, channels)
    labels = np.array([index[it[1]] for it in items], dtype=np.int64)
    is_clean = np.array([it[2] for it in items], dtype=float)
    return images, labels, class_names, (None if np.isnan(is_clean).all() else is_clean)
