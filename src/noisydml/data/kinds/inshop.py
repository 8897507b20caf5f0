"""Dataset kind ``inshop``: In-Shop Clothes Retrieval (DeepFashion); its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from noisydml.data import DatasetError
from noisydml.data.benchmarks import Benchmark, benchmark_kind, first_existing, relative, image_rows, read_table
from noisydml.data.download import Archive


def _inshop_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    # list_eval_partition.txt: a count line, a header line, then "image_name item_id evaluation_status"
    table = read_table(first_existing(raw / "list_eval_partition.txt", raw / "Eval" / "list_eval_partition.txt"),
                        ["path", "item", "status"], skip=2)
    bad = sorted(set(table["status"]) - {"train", "query", "gallery"})
    if bad:
        raise DatasetError(f"list_eval_partition.txt: evaluation_status {bad[0]!r}; expected train, query or gallery")
    return image_rows([relative(raw, raw / p) for p in table["path"]], table["item"], table["status"])  # img/...


BENCHMARK = Benchmark(
    "In-Shop Clothes Retrieval (DeepFashion)",
    (Archive("img.zip", where="on request from the DeepFashion authors (In-shop Clothes Retrieval Benchmark, "
                              "Img/img.zip; https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html)"),
     Archive("list_eval_partition.txt", where="with img.zip (Eval/list_eval_partition.txt)")),
    _inshop_layout, {"train_samples": 25882, "query_samples": 14218, "gallery_samples": 12612,
                     "train_classes": 3997, "query_classes": 3985, "gallery_classes": 3985},
    extract=("img.zip",), source="DeepFashion In-shop (Liu et al. 2016), by request",
    disk="0.8 GB archive + 0.8 GB extracted",
    download_bytes=3.1e9,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("inshop", BENCHMARK)
