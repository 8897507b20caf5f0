"""Dataset kind ``cars196``: "Cars196 (Stanford Cars)", CARS196_ARCHIVES, _cars196_layout -- its archives, official split and counts (:class:`noisydml.data.benchmarks.Benchmark`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.data.benchmarks import Benchmark, benchmark_kind, need, relative, image_rows
from noisydml.data.download import Archive


def cars196_rows(raw: Path, folder: Path) -> tuple[list[str], np.ndarray]:
    """``(paths relative to raw, class ids 1..196)`` from ``cars_annos.mat`` (the whole dataset, 16,185 images)."""
    from scipy.io import loadmat

    annos = loadmat(need(raw / "cars_annos.mat", "Cars196 annotations"), squeeze_me=True)["annotations"]
    annos = np.atleast_1d(annos)
    paths = [relative(raw, folder / str(a["relative_im_path"])) for a in annos]
    classes = np.array([int(a["class"]) for a in annos], dtype=np.int64)
    return paths, classes


def _cars196_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    paths, classes = cars196_rows(raw, raw)  # relative_im_path is car_ims/<id>.jpg
    return image_rows(paths, classes, np.where(classes <= 98, "train", "test"))


CARS196_ARCHIVES = (
    Archive("car_ims.tgz", "http://ai.stanford.edu/~jkrause/car196/car_ims.tgz",
            where="from a mirror of Stanford Cars (its original host, ai.stanford.edu/~jkrause, is gone; e.g. the "
                  "Kaggle dataset 'jessicali9530/stanford-cars-dataset' or Hugging Face copies hold car_ims.tgz)"),
    Archive("cars_annos.mat", "http://ai.stanford.edu/~jkrause/car196/cars_annos.mat",
            where="from the same mirror as car_ims.tgz (cars_annos.mat: every image's class, 1-196)"),
)


BENCHMARK = Benchmark(
    "Cars196 (Stanford Cars)", CARS196_ARCHIVES, _cars196_layout,
    {"train_samples": 8054, "test_samples": 8131, "train_classes": 98, "test_classes": 98},
    extract=("car_ims.tgz",), source="Stanford Cars (Krause et al. 2013): car_ims.tgz + cars_annos.mat; the "
                                      "original host is gone, no checksum is pinned",
    disk="1.9 GB archive + 1.9 GB extracted",
    download_bytes=1.9e9,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("cars196", BENCHMARK)
