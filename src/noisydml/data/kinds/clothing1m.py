"""Dataset kind ``clothing1m``: Clothing1M; its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.data import DatasetError
from noisydml.data.benchmarks import Benchmark, benchmark_kind, relative, image_rows, read_table
from noisydml.data.download import Archive


def _clothing_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    ann = raw / "annotations" if (raw / "annotations").is_dir() else raw
    noisy = dict(read_table(ann / "noisy_label_kv.txt", ["key", "label"]).itertuples(index=False))
    clean = dict(read_table(ann / "clean_label_kv.txt", ["key", "label"]).itertuples(index=False))
    train_keys = read_table(ann / "noisy_train_key_list.txt", ["key"])["key"]
    test_keys = read_table(ann / "clean_test_key_list.txt", ["key"])["key"]
    missing = [k for k in train_keys if k not in noisy][:3] + [k for k in test_keys if k not in clean][:3]
    if missing:
        raise DatasetError(f"Clothing1M: no label for {missing} in noisy_label_kv.txt / clean_label_kv.txt")
    # a training image that also has a clean label is verified: clean when both labels agree
    flags = [float(clean[k] == noisy[k]) if k in clean else np.nan for k in train_keys]
    images = raw  # the key lists name images/<i>/<j>/<file>.jpg
    train = image_rows([relative(raw, images / k) for k in train_keys], [int(noisy[k]) for k in train_keys],
                   ["train"] * len(train_keys), flags)
    test = image_rows([relative(raw, images / k) for k in test_keys], [int(clean[k]) for k in test_keys],
                  ["test"] * len(test_keys))
    return pd.concat([train, test], ignore_index=True)


BENCHMARK = Benchmark(
    "Clothing1M",
    (Archive("annotations.zip", where="on request from the Clothing1M authors (Xiao et al. 2015; "
                                      "https://github.com/Cysu/noisy_label)"),
     *(Archive(f"{i}.tar", where="on request from the Clothing1M authors (images/<i>.tar)") for i in range(10))),
    _clothing_layout, {"train_samples": 1000000, "test_samples": 10526, "train_classes": 14, "test_classes": 14},
    extract=("annotations.zip", *(f"{i}.tar" for i in range(10))), shared_classes=True,
    source="Clothing1M (Xiao et al. 2015), by request; its verified clean labels give is_clean",
    disk="about 40 GB of archives + 40 GB extracted",
    download_bytes=80e9,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("clothing1m", BENCHMARK)
