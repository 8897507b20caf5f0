"""Dataset kinds: each turns its params.yaml section into a prepared dataset folder.

A dataset kind is one module, ``noisydml.data.kinds.<kind>``, whose ``KIND`` is a :class:`DatasetKind`: its params
schema, what it knows of its class count before preparing (for early validation), a ``prepare`` function that
writes the folder through :func:`noisydml.data.prepared.write_prepared`, for a benchmark its archives and official
counts (:class:`noisydml.data.benchmarks.Benchmark`), and the modules the train stage runs for it after training
(a face dataset: its verification sets' embeddings). Kinds are imported by name when a stage uses one, so the
code a dataset's stages run is its kind's (the ``code/datasets/<dataset>.json`` unit), and a change to one kind
re-runs the stages of the datasets of that kind and no other. Adding a kind = adding its module.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from tqdm import tqdm

from noisydml.schema import Field, ParamsError, check_choice, check_kinded, check_section
from noisydml.data.prepared import write_prepared

#: The package holding one module per dataset kind.
KINDS_PACKAGE = "noisydml.data.kinds"


@dataclass(frozen=True)
class DatasetKind:
    schema: dict[str, Field]
    #: ``prepare(name, cfg, out_dir, base_dir, workers)``: ``workers`` processes may decode images (0: all cores)
    prepare: Callable[[str, dict, Path, Path, int], dict]
    train_classes: Callable[[dict], int | None] = lambda cfg: None
    extra_check: Callable[[dict, str], None] = lambda cfg, where: None
    #: A benchmark's archives, official split and counts (:class:`noisydml.data.benchmarks.Benchmark`); None: the
    #: download stage has nothing to fetch.
    benchmark: Any = None
    #: The module whose ``after_training(model, retrieval, params, seed, prepared_dir, run_folder)`` the train stage
    #: runs on a run of this kind (imported by name; in the dataset's ``code/training`` unit), or None.
    after_training: str | None = None

    def check(self, body: dict, where: str) -> dict:
        cfg = check_section(body, self.schema, where)
        self.extra_check(cfg, where)
        return cfg


def embedded_kind(kind: str, generate: Callable, classes: str, default_classes: int, max_classes: int,
                  generator: dict[str, Field] | None = None,
                  extra_check: Callable[[dict, str], None] = lambda cfg, where: None) -> DatasetKind:
    """A dataset the prepare stage renders offline with ``generate(num_classes, images_per_class, image_size,
    seed, progress=..., **generator keys)``: ``classes`` (what a class is) up to ``max_classes``; the first half of
    the classes train. ``generator``: the kind's own keys, passed to ``generate`` by name."""
    generator = generator or {}

    def prepare(name: str, cfg: dict, out_dir: Path, base_dir: Path, workers: int = 0) -> dict:
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


def kind_names() -> list[str]:
    """Every dataset kind: the modules of :data:`KINDS_PACKAGE`."""
    package = importlib.import_module(KINDS_PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def dataset_kind(kind: str) -> DatasetKind:
    """Dataset kind ``kind`` (imports its module); refuses an unknown one, naming the kinds there are."""
    names = kind_names()
    check_choice(kind, names, "dataset kind", "dataset kind")
    return importlib.import_module(f"{KINDS_PACKAGE}.{kind}").KIND


class _DatasetKinds(Mapping):
    """Kind name -> :class:`DatasetKind`, each module imported when first looked up."""

    def __getitem__(self, kind: str) -> DatasetKind:
        if kind not in kind_names():
            raise KeyError(kind)
        return dataset_kind(kind)

    def __iter__(self) -> Iterator[str]:
        return iter(kind_names())

    def __len__(self) -> int:
        return len(kind_names())


#: Every dataset kind by name (a lazy mapping: a lookup imports that kind's module only).
DATASET_KINDS: Mapping[str, DatasetKind] = _DatasetKinds()


def prepare_dataset(name: str, cfg: dict, out_dir: str | Path, base_dir: str | Path = ".", workers: int = 0) -> dict:
    """Prepare dataset ``name`` (a validated params section) into ``out_dir``; return its info."""
    return dataset_kind(cfg["kind"]).prepare(name, cfg, Path(out_dir), Path(base_dir), workers)


def known_train_classes(cfg: dict) -> int:
    """The training classes a validated dataset entry has before it is prepared (0: not known until then)."""
    return int(dataset_kind(cfg["kind"]).train_classes(cfg) or 0)


def check_dataset(params: dict, name: str) -> dict:
    """Validate ``datasets.<name>`` with its kind's schema (defaults filled in), store it back, return it."""
    return check_kinded(params, "datasets", name, DATASET_KINDS, "dataset")


__all__ = ["DATASET_KINDS", "DatasetKind", "ParamsError", "check_dataset", "dataset_kind", "embedded_kind",
           "kind_names", "known_train_classes", "prepare_dataset"]
