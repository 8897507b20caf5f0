"""The papers' benchmarks: where their files come from, their official splits, and the counts that check them.

Each benchmark is a :class:`Benchmark`: the archives its download stage fetches (:mod:`noisydml.data.download`)
and extracts into one folder, the dataset's *files tree* (``data/raw/<dataset>/files``, or a folder of the user's
that already holds the extracted dataset: ``datasets.<name>.local_dir``), and a ``layout`` function that reads
the dataset's *own* metadata from that tree and returns one row per image: ``path`` (relative to the tree),
``class_name``, ``split`` (train / test, or train / query /
gallery) and ``is_clean`` (real-noise datasets: 1 verified clean, 0 verified noisy, NaN unknown). The prepare
stage then checks the official counts (:data:`Benchmark.counts`: it stops with an error that names both figures
when one differs, because published DML code has silently trained on the wrong images before), verifies every
image and writes the files manifest (:func:`noisydml.data.prepared.write_prepared_files`).

Splits (``../shared/papers/NOTES.md``, "Datasets and splits"):

==============  =====================================================  ==================================
dataset         train                                                  evaluation
==============  =====================================================  ==================================
cub200          classes 1-100 (5,864 images)                           101-200 (5,924)
cars196         classes 1-98 (8,054)                                   99-196 (8,131)
sop             ``Ebay_train.txt`` (59,551; 11,318 classes)            ``Ebay_test.txt`` (60,502; 11,316)
inshop          ``list_eval_partition.txt`` train (25,882; 3,997)      query (14,218) / gallery (12,612)
food101n        Food-101N, its first 50 classes (file order)           Food-101, the other 51 classes
cars98n         the CARS-98N web images (98 classes)                   Cars196's classes 99-196
clothing1m      the 1M noisy training images (14 classes)              the clean test set (10,526)
cnwl_cars       a CNWL Red Stanford Cars training split, labels 0-97   its clean images of labels 98-195
==============  =====================================================  ==================================
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from noisydml.data import DatasetError
from noisydml.data.download import Archive
from noisydml.schema import Field, ParamsError

#: Where a benchmark's archives are downloaded, and its files tree, relative to the dataset's raw folder.
DOWNLOADS = "downloads"
FILES = "files"


@dataclass(frozen=True)
class Benchmark:
    title: str
    archives: tuple[Archive, ...]
    #: ``layout(files_tree, cfg) -> DataFrame(path, class_name, split, is_clean)``
    layout: Callable[[Path, dict], pd.DataFrame]
    #: Official counts checked before preparing: ``<split>_samples`` and ``<split>_classes``.
    counts: dict[str, int]
    #: Archives that are extracted into the files tree (the others, such as a .mat or .txt file, are copied there).
    extract: tuple[str, ...] = ()
    #: Whether training and evaluation share classes (Clothing1M: 14 classes in both); otherwise they are disjoint.
    shared_classes: bool = False
    source: str = ""
    disk: str = ""
    #: Its archives' (or fetched files') size in bytes, as published: the plan counts them twice (archives and
    #: extracted files).
    download_bytes: float = 0.0
    #: A list of image URLs fetched one by one into the files tree (CARS-98N): ``(list file, function(tree, cfg) ->
    #: DataFrame(url, path))``.
    url_list: tuple[str, Callable[[Path, dict], pd.DataFrame]] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Counts that depend on an option: ``((key, value, counts), ...)``, applied over :data:`counts` when
    #: ``cfg[key] == value`` (Food-101N's ``test_images: test`` evaluates on 12,750 images, not 51,000).
    option_counts: tuple[tuple[str, str, dict[str, int]], ...] = ()
    #: Lower bounds where no exact count can be official (CARS-98N: images fetched from the web, links die):
    #: checked unless ``expect`` names the key.
    min_counts: dict[str, int] = field(default_factory=dict)
    #: The benchmark's own params keys (beside ``local_dir``, ``archives``, ``expect``), read by its layout.
    options: dict[str, Field] = field(default_factory=dict)
    #: ``check(cfg, where)``: a check of the options beyond their schema, raising ``ParamsError``.
    check: Callable[[dict, str], None] = lambda cfg, where: None

    def official_counts(self, cfg: dict) -> dict[str, int]:
        """The counts a dataset entry ``cfg`` must give: :data:`counts`, then the options', then its ``expect``."""
        counts = dict(self.counts)
        for key, value, more in self.option_counts:
            if cfg.get(key) == value:
                counts.update(more)
        return {**counts, **cfg.get("expect", {})}


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        raise DatasetError(f"{path}: missing ({what}); run the download stage (dvc repro download@<dataset>), or "
                           "give datasets.<dataset>.local_dir a folder holding the extracted dataset (README)")
    return path


def _first(*paths: Path) -> Path:
    """The first of ``paths`` that exists (metadata some copies keep in a sub-folder), else the first."""
    return next((p for p in paths if p.exists()), paths[0])


def _rel(raw: Path, path: Path) -> str:
    return path.relative_to(raw).as_posix()


def _items(paths, classes, splits, is_clean=None) -> pd.DataFrame:
    n = len(paths)
    return pd.DataFrame({"path": list(paths), "class_name": [str(c) for c in classes], "split": list(splits),
                         "is_clean": np.full(n, np.nan) if is_clean is None else np.asarray(is_clean, float)})


def _read_table(path: Path, names: list[str], skip: int = 0, sep: str = r"\s+") -> pd.DataFrame:
    return pd.read_csv(_need(path, "metadata"), sep=sep, header=None, names=names, skiprows=skip, dtype=str,
                       keep_default_na=False, engine="python" if sep != r"\s+" else "c")


# --- CUB-200-2011 -------------------------------------------------------------------------------------------

def _cub_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    root = raw / "CUB_200_2011"
    images = _read_table(root / "images.txt", ["id", "path"])
    labels = _read_table(root / "image_class_labels.txt", ["id", "cls"])
    table = images.merge(labels, on="id", how="left", validate="one_to_one")
    if table["cls"].isna().any() or (table["cls"] == "").any():
        raise DatasetError(f"{root / 'image_class_labels.txt'}: no class for image id {table['id'][table['cls'].isna()].iloc[0]}")
    cls = table["cls"].astype(int)
    return _items([_rel(raw, root / "images" / p) for p in table["path"]], cls,
                  np.where(cls <= 100, "train", "test"))


# --- Cars196 ------------------------------------------------------------------------------------------------

def _cars196_rows(raw: Path, folder: Path) -> tuple[list[str], np.ndarray]:
    """``(paths relative to raw, class ids 1..196)`` from ``cars_annos.mat`` (the whole dataset, 16,185 images)."""
    from scipy.io import loadmat

    annos = loadmat(_need(raw / "cars_annos.mat", "Cars196 annotations"), squeeze_me=True)["annotations"]
    annos = np.atleast_1d(annos)
    paths = [_rel(raw, folder / str(a["relative_im_path"])) for a in annos]
    classes = np.array([int(a["class"]) for a in annos], dtype=np.int64)
    return paths, classes


def _cars196_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    paths, classes = _cars196_rows(raw, raw)  # relative_im_path is car_ims/<id>.jpg
    return _items(paths, classes, np.where(classes <= 98, "train", "test"))


CARS196_ARCHIVES = (
    Archive("car_ims.tgz", "http://ai.stanford.edu/~jkrause/car196/car_ims.tgz",
            where="from a mirror of Stanford Cars (its original host, ai.stanford.edu/~jkrause, is gone; e.g. the "
                  "Kaggle dataset 'jessicali9530/stanford-cars-dataset' or Hugging Face copies hold car_ims.tgz)"),
    Archive("cars_annos.mat", "http://ai.stanford.edu/~jkrause/car196/cars_annos.mat",
            where="from the same mirror as car_ims.tgz (cars_annos.mat: every image's class, 1-196)"),
)


# --- Stanford Online Products -------------------------------------------------------------------------------

def _sop_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    root = raw / "Stanford_Online_Products"
    parts = []
    for split, name in (("train", "Ebay_train.txt"), ("test", "Ebay_test.txt")):
        table = _read_table(root / name, ["image_id", "class_id", "super_class_id", "path"], skip=1)
        parts.append(_items([_rel(raw, root / p) for p in table["path"]], table["class_id"].astype(int),
                            [split] * len(table)))
    return pd.concat(parts, ignore_index=True)


# --- In-Shop ------------------------------------------------------------------------------------------------

def _inshop_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    # list_eval_partition.txt: a count line, a header line, then "image_name item_id evaluation_status"
    table = _read_table(_first(raw / "list_eval_partition.txt", raw / "Eval" / "list_eval_partition.txt"),
                        ["path", "item", "status"], skip=2)
    bad = sorted(set(table["status"]) - {"train", "query", "gallery"})
    if bad:
        raise DatasetError(f"list_eval_partition.txt: evaluation_status {bad[0]!r}; expected train, query or gallery")
    return _items([_rel(raw, raw / p) for p in table["path"]], table["item"], table["status"])  # img/...


# --- Food-101N ----------------------------------------------------------------------------------------------

def _food_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    noisy = raw / "Food-101N_release"
    food = raw / "food-101"
    # The first 50 classes in the file's own order. Food-101N's classes.txt is not in Python's sorted() order
    # (cheesecake before cheese_plate); no such swap crosses the 50th line, and the PRISM authors' FOOD_test.csv
    # starts at the 51st class (grilled_salmon, label 51 of 1-101), so file order and name order give the same split.
    classes = _read_table(noisy / "meta" / "classes.txt", ["name"], skip=1)["name"].tolist()
    food_classes = _read_table(_need(food / "meta" / "classes.txt", "Food-101's class list"), ["name"])["name"]
    if set(classes) != set(food_classes) or len(classes) != len(set(classes)):
        extra = sorted(set(classes) ^ set(food_classes)) or ["(a repeated name)"]
        raise DatasetError(f"{noisy / 'meta' / 'classes.txt'}: its classes are not Food-101's "
                           f"({food / 'meta' / 'classes.txt'}); first difference: {extra[0]!r}")
    train_classes = set(classes[:50])
    listed = _read_table(noisy / "meta" / "imagelist.tsv", ["key"], skip=1, sep="\t")["key"]
    cls = listed.str.split("/").str[0]
    listed, cls = listed[cls.isin(train_classes)], cls[cls.isin(train_classes)]
    flags = {}
    for name in ("verified_train.tsv", "verified_val.tsv"):
        v = _read_table(noisy / "meta" / name, ["key", "flag"], skip=1, sep="\t")
        flags.update(zip(v["key"], v["flag"].astype(float)))
    train = _items([_rel(raw, noisy / "images" / k) for k in listed], cls, ["train"] * len(listed),
                   [flags.get(k, np.nan) for k in listed])
    # test: Food-101 images of the other 51 classes; "all" (1,000 per class) is the PRISM authors' published list
    # (FOOD_test.csv, 51,000 images), "test" Food-101's own test split (250 per class)
    names = ["test.txt"] if cfg["test_images"] == "test" else ["train.txt", "test.txt"]
    keys = pd.concat([_read_table(food / "meta" / n, ["key"]) for n in names], ignore_index=True)["key"]
    tcls = keys.str.split("/").str[0]
    keys, tcls = keys[~tcls.isin(train_classes)], tcls[~tcls.isin(train_classes)]
    unknown = sorted(set(tcls) - set(classes))
    if unknown:
        raise DatasetError(f"Food-101 class {unknown[0]!r} is not a Food-101N class")
    test = _items([_rel(raw, food / "images" / f"{k}.jpg") for k in keys], tcls, ["test"] * len(keys))
    return pd.concat([train, test], ignore_index=True)


# --- CARS-98N -----------------------------------------------------------------------------------------------

CARS98N_LIST = "CARS_98N_list.csv"


def _cars98n_urls(raw: Path, cfg: dict) -> pd.DataFrame:
    """The list's ``url,label`` lines -> where each image goes: ``images/<label>/<file name>`` (769 names recur
    under more than one class: the class folder keeps them apart)."""
    path = _need(raw / CARS98N_LIST, "CARS-98N image list")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        table = pd.read_csv(f, header=None, names=["url", "label"], dtype=str, keep_default_na=False)
    names = table["url"].str.split("?").str[0].str.rstrip("/").str.split("/").str[-1]
    return pd.DataFrame({"url": table["url"], "label": table["label"],
                         "path": [f"images/{lab}/{name}" for lab, name in zip(table["label"], names)]})


def _cars98n_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    fetched = pd.read_csv(_need(raw / "fetched.csv", "the download stage's record of the fetched images"),
                          dtype=str, keep_default_na=False)
    ok = fetched[fetched["status"].isin(["ok", "present"])].drop_duplicates("path")
    # the list's labels are 0..97; Cars196 ids 1..98 are the same models (the authors' CARSN_train.csv: label + 1)
    train = _items(ok["path"].tolist(), ok["label"].astype(int) + 1, ["train"] * len(ok))
    paths, classes = _cars196_rows(raw, raw)
    keep = classes > 98
    test = _items([p for p, k in zip(paths, keep) if k], classes[keep], ["test"] * int(keep.sum()))
    return pd.concat([train, test], ignore_index=True)


# --- CNWL Red Stanford Cars ----------------------------------------------------------------------------------
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
    table = _read_table(_cnwl_find(tree, name), ["name", "label"])
    bad = table[~table["label"].str.fullmatch(r"\d+")]
    if len(bad):
        raise DatasetError(f"CNWL {name}: label {bad['label'].iloc[0]!r} of {bad['name'].iloc[0]!r} is not an integer")
    table["label"] = table["label"].astype(int)
    return table


def _cnwl_web(tree: Path) -> pd.DataFrame:
    """The annotations, one row per web image and label it was annotated under: ``name`` (id + ".jpg"), ``url``,
    ``annotated_label``, ``annotated_clean``."""
    import json

    with open(_need(_cnwl_find(tree, CNWL_ANNOTATIONS), "CNWL annotations")) as f:
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
    paths = [f"{CNWL_WEB}/{n}" if w else _rel(raw, originals / n) for n, w in zip(train["name"], is_web)]
    clean = pd.concat([_cnwl_split(raw, "red_noise_nl_0.0"), _cnwl_split(raw, "clean_validation")],
                      ignore_index=True).drop_duplicates("name")
    test = clean[clean["label"] >= CNWL_TRAIN_LABELS]
    items = pd.concat([_items(paths, train["label"], ["train"] * len(train), flags),
                       _items([_rel(raw, originals / n) for n in test["name"]], test["label"], ["test"] * len(test))],
                      ignore_index=True)
    own = items[~items["path"].str.startswith(f"{CNWL_WEB}/")]
    missing = [p for p in own["path"] if not (raw / p).is_file()]
    if missing:
        raise DatasetError(
            f"CNWL: {len(missing):,} of Stanford Cars' own images named by the split files are not under "
            f"{originals} (first: {', '.join(missing[:3])}); datasets.<name>.original_images names the folder "
            "in the files tree holding them under the names the split files use")
    return items


# --- Clothing1M ---------------------------------------------------------------------------------------------

def _clothing_layout(raw: Path, cfg: dict) -> pd.DataFrame:
    ann = raw / "annotations" if (raw / "annotations").is_dir() else raw
    noisy = dict(_read_table(ann / "noisy_label_kv.txt", ["key", "label"]).itertuples(index=False))
    clean = dict(_read_table(ann / "clean_label_kv.txt", ["key", "label"]).itertuples(index=False))
    train_keys = _read_table(ann / "noisy_train_key_list.txt", ["key"])["key"]
    test_keys = _read_table(ann / "clean_test_key_list.txt", ["key"])["key"]
    missing = [k for k in train_keys if k not in noisy][:3] + [k for k in test_keys if k not in clean][:3]
    if missing:
        raise DatasetError(f"Clothing1M: no label for {missing} in noisy_label_kv.txt / clean_label_kv.txt")
    # a training image that also has a clean label is verified: clean when both labels agree
    flags = [float(clean[k] == noisy[k]) if k in clean else np.nan for k in train_keys]
    images = raw  # the key lists name images/<i>/<j>/<file>.jpg
    train = _items([_rel(raw, images / k) for k in train_keys], [int(noisy[k]) for k in train_keys],
                   ["train"] * len(train_keys), flags)
    test = _items([_rel(raw, images / k) for k in test_keys], [int(clean[k]) for k in test_keys],
                  ["test"] * len(test_keys))
    return pd.concat([train, test], ignore_index=True)


BENCHMARKS: dict[str, Benchmark] = {
    "cub200": Benchmark(
        "CUB-200-2011",
        (Archive("CUB_200_2011.tgz", "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
                 "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
                 where="from https://data.caltech.edu/records/65de6-vp158 (Caltech DATA)"),),
        _cub_layout, {"train_samples": 5864, "test_samples": 5924, "train_classes": 100, "test_classes": 100},
        extract=("CUB_200_2011.tgz",),
        source="Caltech DATA; sha256 as recorded by TensorFlow Datasets for the same archive (1,150,585,339 bytes)",
        disk="1.2 GB archive + 1.2 GB extracted",
        download_bytes=1.2e9,
    ),
    "cars196": Benchmark(
        "Cars196 (Stanford Cars)", CARS196_ARCHIVES, _cars196_layout,
        {"train_samples": 8054, "test_samples": 8131, "train_classes": 98, "test_classes": 98},
        extract=("car_ims.tgz",), source="Stanford Cars (Krause et al. 2013): car_ims.tgz + cars_annos.mat; the "
                                          "original host is gone, no checksum is pinned",
        disk="1.9 GB archive + 1.9 GB extracted",
        download_bytes=1.9e9,
    ),
    "sop": Benchmark(
        "Stanford Online Products",
        (Archive("Stanford_Online_Products.zip", "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
                 where="from a mirror of Stanford Online Products (Oh Song et al. 2016; the original is "
                       "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip)"),),
        _sop_layout, {"train_samples": 59551, "test_samples": 60502, "train_classes": 11318, "test_classes": 11316},
        extract=("Stanford_Online_Products.zip",), source="Stanford (Oh Song et al. 2016)",
        disk="2.9 GB archive + 2.9 GB extracted",
        download_bytes=5.8e9,
    ),
    "inshop": Benchmark(
        "In-Shop Clothes Retrieval (DeepFashion)",
        (Archive("img.zip", where="on request from the DeepFashion authors (In-shop Clothes Retrieval Benchmark, "
                                  "Img/img.zip; https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion.html)"),
         Archive("list_eval_partition.txt", where="with img.zip (Eval/list_eval_partition.txt)")),
        _inshop_layout, {"train_samples": 25882, "query_samples": 14218, "gallery_samples": 12612,
                         "train_classes": 3997, "query_classes": 3985, "gallery_classes": 3985},
        extract=("img.zip",), source="DeepFashion In-shop (Liu et al. 2016), by request",
        disk="0.8 GB archive + 0.8 GB extracted",
        download_bytes=3.1e9,
    ),
    "food101n": Benchmark(
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
    ),
    "cars98n": Benchmark(
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
    ),
    "clothing1m": Benchmark(
        "Clothing1M",
        (Archive("annotations.zip", where="on request from the Clothing1M authors (Xiao et al. 2015; "
                                          "https://github.com/Cysu/noisy_label)"),
         *(Archive(f"{i}.tar", where="on request from the Clothing1M authors (images/<i>.tar)") for i in range(10))),
        _clothing_layout, {"train_samples": 1000000, "test_samples": 10526, "train_classes": 14, "test_classes": 14},
        extract=("annotations.zip", *(f"{i}.tar" for i in range(10))), shared_classes=True,
        source="Clothing1M (Xiao et al. 2015), by request; its verified clean labels give is_clean",
        disk="about 40 GB of archives + 40 GB extracted",
        download_bytes=80e9,
    ),
    "cnwl_cars": Benchmark(
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
    ),
}


COUNT_KEYS = tuple(f"{split}_{what}" for split in ("train", "test", "query", "gallery")
                   for what in ("samples", "classes"))


def files_tree(name: str, cfg: dict) -> str:
    """The dataset's files tree, relative to the repository (or absolute): ``local_dir``, or where the download
    stage extracts to."""
    return cfg["local_dir"] or f"data/raw/{name}/{FILES}"


def check_counts(name: str, items: pd.DataFrame, expected: dict[str, int],
                 at_least: dict[str, int] | None = None) -> dict[str, int]:
    """Compare the prepared rows with the official counts (and the lower bounds ``at_least``); stop on the first
    difference."""
    found: dict[str, int] = {}
    for split in ("train", "test", "query", "gallery"):
        rows = items[items["split"] == split]
        found[f"{split}_samples"] = int(len(rows))
        found[f"{split}_classes"] = int(rows["class_name"].nunique())
    wrong = {k: (v, found.get(k)) for k, v in expected.items() if found.get(k) != v}
    if wrong:
        key, (want, got) = next(iter(wrong.items()))
        others = "" if len(wrong) == 1 else f" (and {', '.join(k for k in list(wrong)[1:])})"
        raise DatasetError(
            f"{name}: {key.replace('_', ' ')}: the official count is {want:,}, the files give {got:,}{others}. The "
            "download is incomplete or a different version of the dataset; see the README's dataset section "
            f"(datasets.{name}.expect overrides a count, for a subset made on purpose)")
    for key, least in (at_least or {}).items():
        if key not in expected and found.get(key, 0) < least:
            raise DatasetError(
                f"{name}: {key.replace('_', ' ')}: {found.get(key, 0):,} found, the paper's data has {least:,}: "
                "images are missing (dead links or an incomplete download; the download stage records each in "
                f"fetched.csv). Results on fewer images are not the paper's; to train on them anyway, say so: "
                f"datasets.{name}.expect: {{{key}: {found.get(key, 0)}}}")
    return found
