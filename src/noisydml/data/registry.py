"""Dataset kinds: each turns its params.yaml section into a prepared dataset folder.

Adding a dataset kind = one :class:`DatasetKind` entry in :data:`DATASET_KINDS`:
its params schema, what it knows of its class count before preparing (for
early validation), and a ``prepare`` function that writes the folder through
:func:`noisydml.data.prepared.write_prepared`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from noisydml.schema import Field, ParamsError, check_kinded, check_section
from noisydml.data.prepared import write_prepared


@dataclass(frozen=True)
class DatasetKind:
    schema: dict[str, Field]
    prepare: Callable[[str, dict, Path, Path], dict]
    train_classes: Callable[[dict], int | None] = lambda cfg: None
    extra_check: Callable[[dict, str], None] = lambda cfg, where: None

    def check(self, body: dict, where: str) -> dict:
        cfg = check_section(body, self.schema, where)
        self.extra_check(cfg, where)
        return cfg


def _prepare_glyphs(name: str, cfg: dict, out_dir: Path, base_dir: Path) -> dict:
    from noisydml.data import glyphs

    with tqdm(total=cfg["num_classes"], desc=f"prepare {name}: rendering classes", unit="class") as bar:
        images, labels, class_names = glyphs.generate(
            cfg["num_classes"], cfg["images_per_class"], cfg["image_size"], cfg["seed"], progress=bar
        )
    return write_prepared(out_dir, images, labels, class_names, {"name": name, "kind": "glyphs", **cfg})


def _prepare_folder(name: str, cfg: dict, out_dir: Path, base_dir: Path) -> dict:
    from noisydml.data.folder import load_folder_dataset

    images, labels, class_names, is_clean = load_folder_dataset(cfg, base_dir, desc=f"prepare {name}: reading images")
    return write_prepared(out_dir, images, labels, class_names, {"name": name, "kind": "folder", **cfg},
                          is_clean=is_clean)


def _check_folder(cfg: dict, where: str) -> None:
    if bool(cfg["root"]) == bool(cfg["csv"]):
        raise ParamsError(f"{where}: give exactly one of 'root' (one sub-folder per class) or 'csv' (path,label)")


DATASET_KINDS: dict[str, DatasetKind] = {
    "glyphs": DatasetKind(
        schema={
            "num_classes": Field(int, 400, min=4, max=423, help="distinct characters; 423 are available"),
            "images_per_class": Field(int, 32, min=2),
            "image_size": Field(int, 32, min=8, max=64),
            "seed": Field(int, 0, min=0),
        },
        prepare=_prepare_glyphs,
        train_classes=lambda cfg: cfg["num_classes"] // 2,
    ),
    "folder": DatasetKind(
        schema={
            "root": Field(str, "", help="folder with one sub-folder per class"),
            "csv": Field(str, "", help="CSV of path,label"),
            "image_size": Field(int, 64, min=8),
            "channels": Field(int, 3, choices=(1, 3)),
        },
        prepare=_prepare_folder,
        extra_check=_check_folder,
    ),
}


def prepare_dataset(name: str, cfg: dict, out_dir: str | Path, base_dir: str | Path = ".") -> dict:
    """Prepare dataset ``name`` (a validated params section) into ``out_dir``; return its info."""
    return DATASET_KINDS[cfg["kind"]].prepare(name, cfg, Path(out_dir), Path(base_dir))


def check_dataset(params: dict, name: str) -> dict:
    """Validate ``datasets.<name>`` with its kind's schema (defaults filled in), store it back, return it."""
    return check_kinded(params, "datasets", name, DATASET_KINDS, "dataset")
