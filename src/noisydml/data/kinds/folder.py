"""Dataset kind ``folder``: your own images, one sub-folder per class or a CSV of ``path,label`` rows
(:mod:`noisydml.data.folder`)."""

from __future__ import annotations

from pathlib import Path

from noisydml.data.folder import load_folder_dataset, scan_folder_dataset
from noisydml.data.prepared import write_prepared, write_prepared_files
from noisydml.data.registry import DatasetKind
from noisydml.schema import Field, ParamsError


def _prepare(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
    info = {"name": name, "kind": "folder", **cfg}
    if cfg["storage"] == "files":
        files, images_root, labels, class_names, is_clean, split = scan_folder_dataset(
            cfg, base_dir, workers, desc=f"prepare {name}: verifying images")
        return write_prepared_files(out_dir, files, images_root, labels, class_names, info, is_clean=is_clean,
                                    split=split)
    images, labels, class_names, is_clean, split = load_folder_dataset(cfg, base_dir,
                                                                       desc=f"prepare {name}: reading images")
    return write_prepared(out_dir, images, labels, class_names, info, is_clean=is_clean, split=split)


def _check(cfg: dict, where: str) -> None:
    if bool(cfg["root"]) == bool(cfg["csv"]):
        raise ParamsError(f"{where}: give exactly one of 'root' (one sub-folder per class) or 'csv' (path,label)")


KIND = DatasetKind(
    schema={
        "root": Field(str, "", help="folder with one sub-folder per class"),
        "csv": Field(str, "", help="CSV of path,label[,is_clean][,split]"),
        "storage": Field(str, "arrays", choices=("arrays", "files"),
                         help="arrays: decoded once into images.npy at image_size; files: kept as files, "
                              "decoded per batch with train.input's transforms (large datasets)"),
        "image_size": Field(int, 64, min=8, help="storage arrays: the side images are resized to"),
        "channels": Field(int, 3, choices=(1, 3)),
    },
    prepare=_prepare,
    extra_check=_check,
)
