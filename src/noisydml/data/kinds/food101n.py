"""Dataset kind ``food101n``: Food-101N (+ Food-101 for testing); its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.data import DatasetError
from noisydml.data.benchmarks import Benchmark, benchmark_kind, need, relative, image_rows, read_table
from noisydml.data.download import Archive
from noisydml.schema import Field


def _food_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    noisy = raw / "Food-101N_release"
    food = raw / "food-101"
    # The first 50 classes in the file's own order. Food-101N's classes.txt is not in Python's sorted() order
    # (cheesecake before cheese_plate); no such swap crosses the 50th line, and the PRISM authors' FOOD_test.csv
    # starts at the 51st class (grilled_salmon, label 51 of 1-101), so file order and name order give the same split.
    classes = read_table(noisy / "meta" / "classes.txt", ["name"], skip=1)["name"].tolist()
    food_classes = read_table(need(food / "meta" / "classes.txt", "Food-101's class list"), ["name"])["name"]
    if set(classes) != set(food_classes) or len(classes) != len(set(classes)):
        extra = sorted(set(classes) ^ set(food_classes)) or ["(a repeated name)"]
        raise DatasetError(f"{noisy / 'meta' / 'classes.txt'}: its classes are not Food-101's "
                           f"({food / 'meta' / 'classes.txt'}); first difference: {extra[0]!r}")
    train_classes = set(classes[:50])
    listed = read_table(noisy / "meta" / "imagelist.tsv", ["key"], skip=1, sep="\t")["key"]
    cls = listed.str.split("/").str[0]
    listed, cls = listed[cls.isin(train_classes)], cls[cls.isin(train_classes)]
    flags = {}
    for name in ("verified_train.tsv", "verified_val.tsv"):
        v = read_table(noisy / "meta" / name, ["key", "flag"], skip=1, sep="\t")
        flags.update(zip(v["key"], v["flag"].astype(float)))
    train = image_rows([relative(raw, noisy / "images" / k) for k in listed], cls, ["train"] * len(listed),
                   [flags.get(k, np.nan) for k in listed])
    # test: Food-101 images of the other 51 classes; "all" (1,000 per class) is the PRISM authors' published list
    # (FOOD_test.csv, 51,000 images), "test" Food-101's own test split (250 per class)
    names = ["test.txt"] if cfg["test_images"] == "test" else ["train.txt", "test.txt"]
    keys = pd.concat([read_table(food / "meta" / n, ["key"]) for n in names], ignore_index=True)["key"]
    tcls = keys.str.split("/").str[0]
    keys, tcls = keys[~tcls.isin(train_classes)], tcls[~tcls.isin(train_classes)]
    unknown = sorted(set(tcls) - set(classes))
    if unknown:
        raise DatasetError(f"Food-101 class {unknown[0]!r} is not a Food-101N class")
    test = image_rows([relative(raw, food / "images" / f"{k}.jpg") for k in keys], tcls, ["test"] * len(keys))
    return pd.concat([train, test], ignore_index=True)


BENCHMARK = Benchmark(
    "Food-101N (+ Food-101 for testing)",
    (Archive("Food-101N_release.zip", "https://iudata.blob.core.windows.net/food101/Food-101N_release.zip",
             where="from the Food-101N page (Lee et al. 2018, CleanNet; https://kuanghuei.github.io/Food-101N/)"),
     Archive("food-101.tar.gz", "http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz",
             "d97d15e438b7f4498f96086a4f7e2fa42a32f2712e87d3295441b2b6314053a4",
             where="from https://data.vision.ee.ethz.ch/cvl/datasets_extra/food-101/")),
    _food_layout, {"train_classes": 50, "test_classes": 51, "test_samples": 51000},
    extract=("Food-101N_release.zip", "food-101.tar.gz"),
    option_counts=(("test_images", "test", {"test_samples": 12750}),),
    options={"test_images": Field(str, "all", choices=("all", "test"),
                                  help="ours: all = every Food-101 image of the 51 test classes (the PRISM "
                                       "authors' FOOD_test.csv, 51,000); test = Food-101's test split (12,750)")},
    source="Food-101N (verification flags kept as is_clean) and Food-101 (sha256 as recorded by TensorFlow "
           "Datasets)",
    disk="about 12 GB of archives + 12 GB extracted",
    download_bytes=24e9,
    notes=("test_images 'all' (default) evaluates on every Food-101 image of the 51 test classes (51,000: the "
           "PRISM authors' FOOD_test.csv); 'test' on Food-101's test split only (12,750)",),
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("food101n", BENCHMARK)
