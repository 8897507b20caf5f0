"""Dataset kind ``cnwl_cars``: CNWL Red Stanford Cars (web label noise, annotated per image); its archives, official split and counts
(:class:`noisydml.data.benchmarks.Benchmark`), params schema, download and prepare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from noisydml.data import DatasetError
from noisydml.data.benchmarks import Benchmark, benchmark_kind, need, relative, image_rows, read_table
from noisydml.data.download import Archive
from noisydml.data.kinds.cars196 import CARS196_ARCHIVES
from noisydml.schema import Field, ParamsError


# Controlled Noisy Web Labels (Jiang et al., ICML 2020, "Beyond Synthetic Noise"): Google's release holds, per noise
# level p, a training split in which a share p of Stanford Cars' images is replaced by web images that annotators
# judged wrongly labelled ("red" noise), and per web image its URL and the annotators' verdict. The release names
# no images of its own (dataset_no_images.zip): web images are fetched from their URLs (many die), Stanford Cars'
# images come from a copy of the dataset. Split files hold "<image name> <label>" lines, labels 0..195; a name that
# is a web image's id (+ ".jpg") is a web image (the rule of TensorFlow Datasets' builder for the mini-ImageNet
# half), any other is one of Stanford Cars' own images.

CNWL_RELEASE = "dataset_no_images.zip"
#: The release's noise levels (the paper: 0, 5, 10, 15, 20, 30, 40, 50, 60 and 80%), as its split files name them.
CNWL_LEVELS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
CNWL_ANNOTATIONS = "stanford-cars-annotations.json"
#: Web images go here in the files tree, as ``<image/id>.jpg``.
CNWL_WEB = "web_images"
#: Labels below this train (Stanford Cars' first 98 models); the others are the class-disjoint test set (ours: the
#: DML convention of Cars196 applied to the release's 0-based labels).
CNWL_TRAIN_LABELS = 98


def _cnwl_find(tree: Path, name: str) -> Path:
    """The one file ``name`` of the Stanford Cars half of the release, wherever the zip put it (the mini-ImageNet
    half, in ``mini-imagenet/``, has files of the same names)."""
    found = sorted(p for p in tree.rglob(name) if "mini-imagenet" not in p.relative_to(tree).parts)
    if len(found) != 1:
        raise DatasetError(
            f"CNWL: {len(found)} files named {name!r} outside mini-imagenet/ under {tree}"
            + (f" ({', '.join(str(p.relative_to(tree)) for p in found[:3])})" if found else "")
            + f"; expected exactly one, from Google's {CNWL_RELEASE} (its Stanford Cars split files)")
    return found[0]


def _cnwl_split(tree: Path, name: str) -> pd.DataFrame:
    """A split file's ``name label`` lines."""
    table = read_table(_cnwl_find(tree, name), ["name", "label"])
    bad = table[~table["label"].str.fullmatch(r"\d+")]
    if len(bad):
        raise DatasetError(f"CNWL {name}: label {bad['label'].iloc[0]!r} of {bad['name'].iloc[0]!r} is not an integer")
    table["label"] = table["label"].astype(int)
    return table


def _cnwl_web(tree: Path) -> pd.DataFrame:
    """The annotations, one row per web image and label it was annotated under: ``name`` (id + ".jpg"), ``url``,
    ``annotated_label``, ``annotated_clean``."""
    import json

    with open(need(_cnwl_find(tree, CNWL_ANNOTATIONS), "CNWL annotations")) as f:
        entries = json.load(f)["data"]
    rows = [e[0] for e in entries]
    return pd.DataFrame({"name": [f"{r['image/id']}.jpg" for r in rows], "url": [r["image/uri"] for r in rows],
                         "annotated_label": [int(r["image/class/label"]) for r in rows],
                         "annotated_clean": [bool(r["image/class/label/is_clean"]) for r in rows]}
                        ).drop_duplicates(["name", "annotated_label"])


def _cnwl_check(cfg: dict, where: str) -> None:
    folder = Path(cfg["original_images"])
    if folder.is_absolute() or ".." in folder.parts or not folder.parts:
        raise ParamsError(f"{where}.original_images: {cfg['original_images']!r}; allowed: a folder inside the files "
                          "tree (data/raw/<name>/files, or local_dir), e.g. car_ims; link a copy kept elsewhere "
                          "into it")


def _cnwl_level_file(cfg: dict) -> str:
    return f"red_noise_nl_{cfg['noise_level']}"


def _cnwl_urls(tree: Path, cfg: dict) -> pd.DataFrame:
    """The web images of the chosen level's training classes, fetched to ``web_images/<id>.jpg`` (the release
    lists thousands more; only these are used)."""
    split = _cnwl_split(tree, _cnwl_level_file(cfg))
    web = _cnwl_web(tree)
    url = dict(zip(web["name"], web["url"]))
    used = split[(split["label"] < CNWL_TRAIN_LABELS) & split["name"].isin(url)].drop_duplicates("name")
    return pd.DataFrame({"url": [url[n] for n in used["name"]], "label": used["label"].astype(str),
                         "path": [f"{CNWL_WEB}/{n}" for n in used["name"]]})


def _cnwl_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    """Training: the chosen level's split, labels 0..97; a web image is wrong unless the annotators judged it right
    under that label (``is_clean`` 0/1; NaN for a web image annotated under another label: unknown), Stanford Cars'
    own images are right (1). Test: the clean images (``red_noise_nl_0.0`` and ``clean_validation``) of labels
    98..195. A web image not in ``web_images/`` (its link was dead: the download stage's ``fetched.csv`` says why)
    is left out."""
    split = _cnwl_split(raw, _cnwl_level_file(cfg))
    web = _cnwl_web(raw)
    verdict = {(n, lab): float(c) for n, lab, c in zip(web["name"], web["annotated_label"], web["annotated_clean"])}
    train = split[split["label"] < CNWL_TRAIN_LABELS]
    is_web = train["name"].isin(set(web["name"])).to_numpy()
    keep = ~is_web | np.array([(raw / CNWL_WEB / n).is_file() for n in train["name"]])
    train, is_web = train[keep], is_web[keep]
    flags = np.array([verdict.get((n, lab), np.nan) if w else 1.0
                      for n, lab, w in zip(train["name"], train["label"], is_web)])
    originals = raw / cfg["original_images"]
    paths = [f"{CNWL_WEB}/{n}" if w else relative(raw, originals / n) for n, w in zip(train["name"], is_web)]
    clean = pd.concat([_cnwl_split(raw, "red_noise_nl_0.0"), _cnwl_split(raw, "clean_validation")],
                      ignore_index=True).drop_duplicates("name")
    test = clean[clean["label"] >= CNWL_TRAIN_LABELS]
    items = pd.concat([image_rows(paths, train["label"], ["train"] * len(train), flags),
                       image_rows([relative(raw, originals / n) for n in test["name"]], test["label"], ["test"] * len(test))],
                      ignore_index=True)
    own = items[~items["path"].str.startswith(f"{CNWL_WEB}/")]
    missing = [p for p in own["path"] if not (raw / p).is_file()]
    if missing:
        raise DatasetError(
            f"CNWL: {len(missing):,} of Stanford Cars' own images named by the split files are not under "
            f"{originals} (first: {', '.join(missing[:3])}); datasets.<name>.original_images names the folder "
            "in the files tree holding them under the names the split files use")
    return items


BENCHMARK = Benchmark(
    "CNWL Red Stanford Cars (web label noise, annotated per image)",
    (Archive(CNWL_RELEASE, "https://storage.googleapis.com/cnlw/" + CNWL_RELEASE,
             where="from Google's Controlled Noisy Web Labels page "
                   "(https://google.github.io/controlled-noisy-web-labels/; annotations and split files only)"),
     CARS196_ARCHIVES[0]),
    _cnwl_layout, {"train_classes": CNWL_TRAIN_LABELS, "test_classes": 196 - CNWL_TRAIN_LABELS},
    extract=(CNWL_RELEASE, "car_ims.tgz"), url_list=(CNWL_ANNOTATIONS, _cnwl_urls),
    source="Controlled Noisy Web Labels (Jiang et al. 2020): split files and per-image annotations; web images "
           "fetched from their URLs (dead links recorded and left out); Stanford Cars' own images from a copy "
           "of the dataset; no checksum is published",
    disk="about 0.2 GB of web images + Stanford Cars' 1.9 GB",
    download_bytes=2.1e9,
    notes=("the release publishes no image counts: only the class counts are checked",
           "original_images: where in the files tree Stanford Cars' own images are, under the names the split "
           "files use (ours: car_ims, car_ims.tgz's folder; the release does not say which copy it names)"),
    options={
        "noise_level": Field(float, 0.4, choices=CNWL_LEVELS,
                             help="the release's red noise level: the share of training images replaced by "
                                  "wrongly labelled web images (0.4: ours, a middle level)"),
        "original_images": Field(str, "car_ims",
                                 help="ours: the folder in the files tree with Stanford Cars' own images "
                                      "under the names the split files use"),
    },
    check=_cnwl_check,
)

#: The kind (its params schema, download and prepare: :func:`noisydml.data.benchmarks.benchmark_kind`).
KIND = benchmark_kind("cnwl_cars", BENCHMARK)
