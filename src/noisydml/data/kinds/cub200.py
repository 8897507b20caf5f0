"""Dataset kind ``cub200``: CUB-200-2011; its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.data import DatasetError
from noisydml.data.benchmarks import Benchmark, benchmark_kind, relative, image_rows, read_table
from noisydml.data.download import Archive


def _cub_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    root = raw / "CUB_200_2011"
    images = read_table(root / "images.txt", ["id", "path"])
    labels = read_table(root / "image_class_labels.txt", ["id", "cls"])
    table = images.merge(labels, on="id", how="left", validate="one_to_one")
    if table["cls"].isna().any() or (table["cls"] == "").any():
        raise DatasetError(f"{root / 'image_class_labels.txt'}: no class for image id {table['id'][table['cls'].isna()].iloc[0]}")
    cls = table["cls"].astype(int)
    return image_rows([relative(raw, root / "images" / p) for p in table["path"]], cls,
                  np.where(cls <= 100, "train", "test"))


BENCHMARK = Benchmark(
    "CUB-200-2011",
    (Archive("CUB_200_2011.tgz", "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
             "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
             where="from https://data.caltech.edu/records/65de6-vp158 (Caltech DATA)"),),
    _cub_layout, {"train_samples": 5864, "test_samples": 5924, "train_classes": 100, "test_classes": 100},
    extract=("CUB_200_2011.tgz",),
    source="Caltech DATA; sha256 as recorded by TensorFlow Datasets for the same archive (1,150,585,339 bytes)",
    disk="1.2 GB archive + 1.2 GB extracted",
    download_bytes=1.2e9,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("cub200", BENCHMARK)
