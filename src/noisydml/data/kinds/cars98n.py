"""Dataset kind ``cars98n``: CARS-98N (+ Cars196 for testing); its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd

from noisydml.data.benchmarks import Benchmark, benchmark_kind, need, image_rows
from noisydml.data.download import Archive
from noisydml.data.kinds.cars196 import CARS196_ARCHIVES, cars196_rows


CARS98N_LIST = "CARS_98N_list.csv"


def _cars98n_urls(raw: Path, cfg: dict) -> pd.DataFrame:
    """The list's ``url,label`` lines -> where each image goes: ``images/<label>/<file name>`` (769 names recur
    under more than one class: the class folder keeps them apart)."""
    path = need(raw / CARS98N_LIST, "CARS-98N image list")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        table = pd.read_csv(f, header=None, names=["url", "label"], dtype=str, keep_default_na=False)
    names = table["url"].str.split("?").str[0].str.rstrip("/").str.split("/").str[-1]
    return pd.DataFrame({"url": table["url"], "label": table["label"],
                         "path": [f"images/{lab}/{name}" for lab, name in zip(table["label"], names)]})


def _cars98n_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    fetched = pd.read_csv(need(raw / "fetched.csv", "the download stage's record of the fetched images"),
                          dtype=str, keep_default_na=False)
    ok = fetched[fetched["status"].isin(["ok", "present"])].drop_duplicates("path")
    # the list's labels are 0..97; Cars196 ids 1..98 are the same models (the authors' CARSN_train.csv: label + 1)
    train = image_rows(ok["path"].tolist(), ok["label"].astype(int) + 1, ["train"] * len(ok))
    paths, classes = cars196_rows(raw, raw)
    keep = classes > 98
    test = image_rows([p for p, k in zip(paths, keep) if k], classes[keep], ["test"] * int(keep.sum()))
    return pd.concat([train, test], ignore_index=True)


BENCHMARK = Benchmark(
    "CARS-98N (+ Cars196 for testing)",
    (Archive(CARS98N_LIST, "https://raw.githubusercontent.com/alibaba-edu/Ranking-based-Instance-Selection/"
                           "06e7fa2061d42f5e8181f7181fe591fc3d294f8d/prepare_CARS_98N/CARS_98N_list.csv",
             "5520b88d31e9be80d05ada63d0bb9a983c29bce5fbf140839fe46f026c1aac04",
             where="from the PRISM authors' repository alibaba-edu/Ranking-based-Instance-Selection "
                   "(prepare_CARS_98N/CARS_98N_list.csv)"),
     *CARS196_ARCHIVES),
    _cars98n_layout, {"train_classes": 98, "test_samples": 8131, "test_classes": 98},
    extract=("car_ims.tgz",), url_list=(CARS98N_LIST, _cars98n_urls),
    # the PRISM authors' CARSN_train.csv lists 9,558 of the 9,567 URLs (the rest were dead for them too)
    min_counts={"train_samples": 9558},
    source="9,567 web image URLs with labels (PRISM's authors; many links die over time) + Cars196",
    disk="about 0.3 GB of images + Cars196's 3.8 GB",
    download_bytes=1.2e9,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("cars98n", BENCHMARK)
