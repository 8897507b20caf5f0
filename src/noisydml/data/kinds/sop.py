"""Dataset kind ``sop``: Stanford Online Products; its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from noisydml.data.benchmarks import Benchmark, benchmark_kind, relative, image_rows, read_table
from noisydml.data.download import Archive


def _sop_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    root = raw / "Stanford_Online_Products"
    parts = []
    for split, name in (("train", "Ebay_train.txt"), ("test", "Ebay_test.txt")):
        table = read_table(root / name, ["image_id", "class_id", "super_class_id", "path"], skip=1)
        parts.append(image_rows([relative(raw, root / p) for p in table["path"]], table["class_id"].astype(int),
                            [split] * len(table)))
    return pd.concat(parts, ignore_index=True)


BENCHMARK = Benchmark(
    "Stanford Online Products",
    (Archive("Stanford_Online_Products.zip", "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
             where="from a mirror of Stanford Online Products (Oh Song et al. 2016; the original is "
                   "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip)"),),
    _sop_layout, {"train_samples": 59551, "test_samples": 60502, "train_classes": 11318, "test_classes": 11316},
    extract=("Stanford_Online_Products.zip",), source="Stanford (Oh Song et al. 2016)",
    disk="2.9 GB archive + 2.9 GB extracted",
    download_bytes=5.8e9,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("sop", BENCHMARK)
