"""Dataset kinds: each turns its params.yaml section into a prepared dataset folder.

Adding a dataset kind = one :class:`DatasetKind` entry in :data:`DATASET_KINDS`:
its params schema, what it knows of its class count before preparing (for
early validation), and a ``prepare`` function that writes the folder through
:func:`noisydml.data.prepared.write_prepared`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from tqdm import tqdm

from noisydml.schema import Field, ParamsError, check_kinded, check_section
from noisydml.data.prepared import write_prepared, write_prepared_files


@dataclass(frozen=True)
class DatasetKind:
    schema: dict[str, Field]
    #: ``prepare(name, cfg, out_dir, base_dir, workers)``: ``workers`` processes may decode images (0: all cores)
    prepare: Callable[[str, dict, Path, Path, int], dict]
    train_classes: Callable[[dict], int | None] = lambda cfg: None
    extra_check: Callable[[dict, str], None] = lambda cfg, where: None

    def check(self, body: dict, where: str) -> dict:
        cfg = check_section(body, self.schema, where)
        self.extra_check(cfg, where)
        return cfg


def _embedded_kind(kind: str, classes: str, default_classes: int, max_classes: int,
                   generator: dict[str, Field] | None = None,
                   extra_check: Callable[[dict, str], None] = lambda cfg, where: None) -> DatasetKind:
    """A dataset the prepare stage renders offline with ``noisydml.data.<kind>.generate``:
    ``classes`` (what a class is) up to ``max_classes``; the first half of the classes train. ``generator``: the
    kind's own keys, passed to its ``generate`` by name."""
    generator = generator or {}

    def prepare(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
        from noisydml.data import glyphs, motifs  # imported by name: the prepare stage's code deps see both

        generate = {"glyphs": glyphs.generate, "motifs": motifs.generate}[kind]
        with tqdm(total=cfg["num_classes"], desc=f"prepare {name}: rendering classes", unit="class") as bar:
            images, labels, class_names = generate(
                cfg["num_classes"], cfg["images_per_class"], cfg["image_size"], cfg["seed"], progress=bar,
                **{key: cfg[key] for key in generator}
            )
        return write_prepared(out_dir, images, labels, class_names, {"name": name, "kind": kind, **cfg})

    schema = {
        "num_classes": Field(int, default_classes, min=4, max=max_classes,
                             help=f"{classes}; {max_classes} are available"),
        "images_per_class": Field(int, 32, min=2),
        "image_size": Field(int, 32, min=8, max=64),
        "seed": Field(int, 0, min=0),
        **generator,
    }
    return DatasetKind(schema=schema, prepare=prepare, train_classes=lambda cfg: cfg["num_classes"] // 2,
                       extra_check=extra_check)


def _motifs_kind() -> DatasetKind:
    """Motifs, with the generator's difficulty as keys (ours): the defaults are the ``motifs`` dataset."""
    from noisydml.data import motifs

    def check(cfg: dict, where: str) -> None:
        available = motifs.max_classes(species_per_genus=cfg["species_per_genus"])
        if cfg["num_classes"] > available:
            raise ParamsError(f"{where}.num_classes: {cfg['num_classes']}, but {available} species exist at "
                              f"species_per_genus {cfg['species_per_genus']}; allowed: 4..{available}")

    most = motifs.max_classes(species_per_genus=motifs.MAX_SPECIES_PER_GENUS)
    generator = {
        "species_per_genus": Field(int, motifs.SPECIES_PER_GENUS, min=2, max=motifs.MAX_SPECIES_PER_GENUS,
                                   help="ours: species of one genus (one shape), their hues 1/k of the circle "
                                        "apart; patterns cycle over 4, so past 4 siblings share a pattern"),
        "hue_jitter": Field(float, motifs.HUE_JITTER, min=0.0, max=1.0,
                            help="ours: std of every image's hue turn (body and parts alike, as a fraction of "
                                 "the circle); past ~0.25 hue is a nuisance, not a cue"),
        "whole_genera": Field(bool, False, help="ours: draw whole genera (every species of num_classes / "
                                                "species_per_genus shapes), so siblings meet in the test half"),
    }
    return _embedded_kind("motifs", "species (fine-grained classes)", 200, most, generator, check)


def _prepare_folder(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
    from noisydml.data.folder import load_folder_dataset, scan_folder_dataset

    info = {"name": name, "kind": "folder", **cfg}
    if cfg["storage"] == "files":
        files, images_root, labels, class_names, is_clean, split = scan_folder_dataset(
            cfg, base_dir, workers, desc=f"prepare {name}: verifying images")
        return write_prepared_files(out_dir, files, images_root, labels, class_names, info, is_clean=is_clean,
                                    split=split)
    images, labels, class_names, is_clean, split = load_folder_dataset(cfg, base_dir,
                                                                       desc=f"prepare {name}: reading images")
    return write_prepared(out_dir, images, labels, class_names, info, is_clean=is_clean, split=split)


def _check_folder(cfg: dict, where: str) -> None:
    if bool(cfg["root"]) == bool(cfg["csv"]):
        raise ParamsError(f"{where}: give exactly one of 'root' (one sub-folder per class) or 'csv' (path,label)")


def _faces_kind() -> DatasetKind:
    """Face recognition (SGPS's Table IV): synthetic identities in insightface's formats, or insightface's own
    files (``noisydml.data.faces``)."""
    from noisydml.data import faces

    def prepare(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
        return faces.prepare(name, cfg, out_dir, base_dir, workers)

    def train_classes(cfg: dict) -> int | None:
        if cfg["source"] == "synthetic":
            return cfg["train_identities"]
        release = faces.FACE_RELEASES.get(cfg["release"])  # a range where no exact count is published: its top
        return release.identities[1] - cfg["test_identities"] if release else None

    return DatasetKind(schema=faces.schema(), prepare=prepare, extra_check=faces.check, train_classes=train_classes)


DATASET_KINDS: dict[str, DatasetKind] = {
    "glyphs": _embedded_kind("glyphs", "distinct characters", 400, 423),
    # 144 genera x species_per_genus species (noisydml.data.motifs.max_classes; a test checks the bound)
    "motifs": _motifs_kind(),
    "folder": DatasetKind(
        schema={
            "root": Field(str, "", help="folder with one sub-folder per class"),
            "csv": Field(str, "", help="CSV of path,label[,is_clean][,split]"),
            "storage": Field(str, "arrays", choices=("arrays", "files"),
                             help="arrays: decoded once into images.npy at image_size; files: kept as files, "
                                  "decoded per batch with train.input's transforms (large datasets)"),
            "image_size": Field(int, 64, min=8, help="storage arrays: the side images are resized to"),
            "channels": Field(int, 3, choices=(1, 3)),
        },
        prepare=_prepare_folder,
        extra_check=_check_folder,
    ),
    "faces": _faces_kind(),
}


def _prepare_benchmark(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
    """A benchmark: its files tree (the download stage's, or ``local_dir``) -> official split, count check, every
    image verified, the files manifest."""
    from noisydml.data.benchmarks import BENCHMARKS, check_counts, files_tree
    from noisydml.data.folder import verify_images
    from noisydml.data.prepared import class_order

    bench = BENCHMARKS[cfg["kind"]]
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


def _benchmark_kind(kind: str) -> DatasetKind:
    from noisydml.data.benchmarks import BENCHMARKS

    bench = BENCHMARKS[kind]
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
        from noisydml.data.benchmarks import COUNT_KEYS

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

    return DatasetKind(schema=schema, prepare=_prepare_benchmark, extra_check=check,
                       train_classes=lambda cfg: cfg["expect"].get("train_classes", bench.counts.get("train_classes")))


def _add_benchmarks() -> None:
    from noisydml.data.benchmarks import BENCHMARKS

    for kind in BENCHMARKS:
        DATASET_KINDS[kind] = _benchmark_kind(kind)


_add_benchmarks()


def prepare_dataset(name: str, cfg: dict, out_dir: str | Path, base_dir: str | Path = ".", workers: int = 0) -> dict:
    """Prepare dataset ``name`` (a validated params section) into ``out_dir``; return its info."""
    return DATASET_KINDS[cfg["kind"]].prepare(name, cfg, Path(out_dir), Path(base_dir), workers)


def known_train_classes(cfg: dict) -> int:
    """The training classes a validated dataset entry has before it is prepared (0: not known until then)."""
    return int(DATASET_KINDS[cfg["kind"]].train_classes(cfg) or 0)


def check_dataset(params: dict, name: str) -> dict:
    """Validate ``datasets.<name>`` with its kind's schema (defaults filled in), store it back, return it."""
    return check_kinded(params, "datasets", name, DATASET_KINDS, "dataset")
