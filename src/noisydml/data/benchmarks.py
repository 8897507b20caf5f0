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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

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


def need(path: Path, what: str) -> Path:
    if not path.exists():
        raise DatasetError(f"{path}: missing ({what}); run the download stage (dvc repro download@<dataset>), or "
                           "give datasets.<dataset>.local_dir a folder holding the extracted dataset (README)")
    return path


def first_existing(*paths: Path) -> Path:
    """The first of ``paths`` that exists (metadata some copies keep in a sub-folder), else the first."""
    return next((p for p in paths if p.exists()), paths[0])


def relative(raw: Path, path: Path) -> str:
    return path.relative_to(raw).as_posix()


def image_rows(paths, classes, splits, is_clean=None) -> pd.DataFrame:
    n = len(paths)
    return pd.DataFrame({"path": list(paths), "class_name": [str(c) for c in classes], "split": list(splits),
                         "is_clean": np.full(n, np.nan) if is_clean is None else np.asarray(is_clean, float)})


def read_table(path: Path, names: list[str], skip: int = 0, sep: str = r"\s+") -> pd.DataFrame:
    return pd.read_csv(need(path, "metadata"), sep=sep, header=None, names=names, skiprows=skip, dtype=str,
                       keep_default_na=False, engine="python" if sep != r"\s+" else "c")


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


def prepare_benchmark(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
    """A benchmark: its files tree (the download stage's, or ``local_dir``) -> official split, count check, every
    image verified, the files manifest."""
    from noisydml.data.folder import verify_images
    from noisydml.data.prepared import class_order, write_prepared_files
    from noisydml.data.registry import dataset_kind

    bench = dataset_kind(cfg["kind"]).benchmark
    tree_rel = files_tree(name, cfg)
    tree = base_dir / tree_rel
    items = bench.layout(tree, cfg)
    found = check_counts(name, items, bench.official_counts(cfg), at_least=bench.min_counts)
    checked = verify_images([tree / p for p in items["path"]], workers, desc=f"prepare {name}: verifying images")
    files = pd.DataFrame({"path": items["path"], "width": [c[0] for c in checked],
                          "height": [c[1] for c in checked], "sha256": [c[2] for c in checked]})
    class_names = class_order(items["class_name"])
    index = {c: i for i, c in enumerate(class_names)}
    labels = items["class_name"].map(index).to_numpy(np.int64)
    flags = items["is_clean"].to_numpy(float)
    info = {"name": name, "kind": cfg["kind"], "title": bench.title, **cfg, "official_counts_checked": found}
    return write_prepared_files(out_dir, files, tree_rel, labels, class_names, info,
                                is_clean=None if np.isnan(flags).all() else flags,
                                split=items["split"].to_numpy(object), shared_classes=bench.shared_classes)


def benchmark_kind(kind: str, bench: Benchmark):
    """The :class:`noisydml.data.registry.DatasetKind` of benchmark ``bench`` (named ``kind``): the keys every
    benchmark has (``local_dir``, ``archives``, ``expect``), its own options, and :func:`prepare_benchmark`."""
    from noisydml.data.registry import DatasetKind

    schema = {
        "local_dir": Field(str, "", help="ours: a folder already holding the extracted dataset (its files tree); "
                                         "nothing is downloaded"),
        "archives": Field(dict, {}, help="ours: per archive file name, {url, sha256} replacing the built-in ones "
                                         "(a mirror, a re-released archive)"),
        "expect": Field(dict, {}, help="ours: official counts replaced, e.g. {train_samples: 5000} for a subset "
                                       "made on purpose; keys: <split>_samples / <split>_classes"),
    }
    schema.update(bench.options)
    if bench.url_list is not None:
        schema["fetch_workers"] = Field(int, 16, min=1, help="parallel image fetches")
        schema["retries"] = Field(int, 2, min=0, help="retries of an image URL before it is recorded as dead")

    def check(cfg: dict, where: str) -> None:
        bad = sorted(set(cfg["expect"]) - set(COUNT_KEYS))
        if bad:
            raise ParamsError(f"{where}.expect: {bad[0]!r} is not a count; allowed: {', '.join(COUNT_KEYS)}")
        names = {a.filename for a in bench.archives}
        for filename, body in cfg["archives"].items():
            if filename not in names:
                raise ParamsError(f"{where}.archives: {filename!r} is not one of {kind}'s files; allowed: "
                                  f"{', '.join(sorted(names))}")
            if not isinstance(body, dict) or set(body) - {"url", "sha256"}:
                raise ParamsError(f"{where}.archives.{filename}: expected {{url, sha256}}, got {body!r}")
        bench.check(cfg, where)

    return DatasetKind(schema=schema, prepare=prepare_benchmark, extra_check=check, benchmark=bench,
                       train_classes=lambda cfg: cfg["expect"].get("train_classes", bench.counts.get("train_classes")))


class _Benchmarks(Mapping):
    """Kind name -> :class:`Benchmark`, for the dataset kinds that are benchmarks (each kind's module imported when
    looked up or listed)."""

    def __getitem__(self, kind: str) -> Benchmark:
        from noisydml.data.registry import dataset_kind, kind_names

        bench = dataset_kind(kind).benchmark if kind in kind_names() else None
        if bench is None:
            raise KeyError(kind)
        return bench

    def __iter__(self) -> Iterator[str]:
        from noisydml.data.registry import dataset_kind, kind_names

        return iter([k for k in kind_names() if dataset_kind(k).benchmark is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: Every benchmark by dataset kind (``noisydml.data.kinds.<kind>.BENCHMARK``).
BENCHMARKS: Mapping[str, Benchmark] = _Benchmarks()
