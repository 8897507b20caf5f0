"""Label-noise kinds for the ``corrupt`` stage.

A noise kind is a :class:`NoiseKind`: the schema of its params.yaml section
and ``apply(true_labels, cfg, inputs) -> NoiseOutcome``. Labels are the
training labels, ``0..C-1``; a kind returns noisy labels in the same ids.
:func:`corrupt_labels` does what every kind shares: checks its input, marks
``is_noisy``, relabels the classes that remain to ``0..K-1`` (small-cluster
noise removes classes) and computes the statistics (see
:mod:`noisydml.noise.stats`). Adding a kind = one entry in :data:`NOISE_KINDS`.

Kinds:

- ``none``: labels as the dataset gives them (real noise). When the manifest
  says which samples were verified clean or noisy (``is_clean``), those flags
  become ``is_noisy`` and the statistics estimate the noise rate from them.
- ``symmetric``: each sample flipped with probability ``rate`` (PRISM, SGPS).
- ``symmetric_per_class``: exactly ``round(rate * n_c)`` flips per class (BSPML).
- ``small_cluster``: whole classes dissolved into k-means clusters that are
  scattered over the kept classes (PRISM, SGPS; open-set noise).
- ``published_list``: the authors' exact noisy lists (PRISM's ``datalist/``; see
  :mod:`noisydml.noise.published_list`), matched to the manifest by image path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from noisydml.schema import Field, ParamsError, check_choice, check_kinded, check_section
from noisydml.noise.published_list import check_published_list, lists_for, published_list_labels
from noisydml.noise.small_cluster import NoiseInputError, dissolved_classes, small_cluster_noise
from noisydml.noise.symmetric import symmetric_noise, symmetric_per_class_noise

__all__ = ["NOISE_KINDS", "check_noise", "NoiseInputError", "NoiseInputs", "corrupt_labels", "nominal_rate"]


@dataclass
class NoiseInputs:
    """What a kind may need beyond the labels; loaded only when a kind asks."""

    #: Returns ``(features (N, d), description for the statistics)``; rows follow the labels.
    features: Callable[[dict], tuple[np.ndarray, dict]] | None = None
    #: Per sample: 1 verified clean, 0 verified noisy, NaN unknown (real-noise datasets).
    is_clean: np.ndarray | None = None
    #: Per sample: the image path relative to the dataset's files tree (file-stored datasets only).
    paths: np.ndarray | None = None
    #: The dataset's name in params.yaml (kinds whose settings differ per dataset).
    dataset: str | None = None


@dataclass
class NoiseOutcome:
    labels: np.ndarray
    #: Samples known to carry a wrong label; None = those whose label changed.
    is_noisy: np.ndarray | None = None
    extra_stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class NoiseKind:
    schema: dict[str, Field]
    apply: Callable[[np.ndarray, dict, NoiseInputs], NoiseOutcome]
    description: str
    #: Every class must have at least this many images (checked before any work).
    min_class_size: int = 1
    #: ``(validated cfg, raw section, where) -> cfg``: checks beyond the schema.
    extra_check: Callable[[dict, dict, str], dict] = lambda cfg, raw, where: cfg

    def check(self, body: dict, where: str) -> dict:
        return self.extra_check(check_section(body, self.schema, where), body, where)


# --------------------------------------------------------------------------- the kinds


def _none(labels: np.ndarray, cfg: dict, inputs: NoiseInputs) -> NoiseOutcome:
    if inputs.is_clean is None:
        return NoiseOutcome(labels.copy())
    verified = ~np.isnan(inputs.is_clean)
    noisy = verified & (inputs.is_clean == 0)
    n_verified = int(verified.sum())
    return NoiseOutcome(labels.copy(), is_noisy=noisy, extra_stats={"verified": {
        "num_verified": n_verified,
        "num_verified_clean": int(n_verified - noisy.sum()),
        "num_verified_noisy": int(noisy.sum()),
        "estimated_rate": float(noisy.sum() / n_verified) if n_verified else None,
        "note": "is_noisy marks verified-noisy samples only; unverified samples count as clean",
    }})


def _small_cluster(labels: np.ndarray, cfg: dict, inputs: NoiseInputs) -> NoiseOutcome:
    if cfg["rate"] == 0:
        return NoiseOutcome(labels.copy(), extra_stats=_cluster_stats(np.array([], np.int64), np.array([], np.int64)))
    dissolved_classes(labels, cfg["rate"], cfg["seed"])  # a rate that needs every class fails before feature work
    features, described = inputs.features(cfg["features"])
    result = small_cluster_noise(labels, cfg["rate"], cfg["seed"], features, progress=True)
    stats = _cluster_stats(result.dissolved, result.cluster_sizes)
    stats["features"] = described
    return NoiseOutcome(result.labels, extra_stats=stats)


def _published_list(labels: np.ndarray, cfg: dict, inputs: NoiseInputs) -> NoiseOutcome:
    if inputs.paths is None:
        raise NoiseInputError("published_list noise matches the lists to the images by path; this dataset's images "
                              "are in-memory arrays without paths (use a file-stored dataset: cub200, cars196, sop)")
    noisy, is_noisy, stats = published_list_labels(np.asarray(inputs.paths), labels,
                                                   lists_for(cfg, inputs.dataset))
    return NoiseOutcome(noisy, is_noisy=is_noisy, extra_stats={"published_list": stats})


def _cluster_stats(dissolved: np.ndarray, sizes: np.ndarray) -> dict:
    size_values, size_counts = np.unique(sizes, return_counts=True)
    return {
        # which ones: per_class.csv, rows with label -1
        "num_dissolved_classes": int(len(dissolved)),
        "moved_clusters": {
            "count": int(len(sizes)),
            "size_histogram": {str(int(s)): int(c) for s, c in zip(size_values, size_counts)},
            "mean_size": float(sizes.mean()) if len(sizes) else 0.0,
            "max_size": int(sizes.max()) if len(sizes) else 0,
        },
    }


FEATURES_SCHEMA = {
    "source": Field(str, "pixels", choices=("pixels", "run"),
                    help="pixels: PCA of the images; run: a grid run's training-set embeddings (the run is named "
                         "per dataset in noise_runs.<dataset>-<noise>)"),
    "pca_dim": Field(int, 32, min=1, help="pixels: dimensions kept by PCA"),
    "pixel_side": Field(int, 32, min=1, help="pixels: images are shrunk to at most this side first"),
}


PIXEL_FEATURE_KEYS = {"pca_dim", "pixel_side"}
RUN_FEATURE_KEYS: set[str] = set()


def _check_small_cluster(cfg: dict, body: dict, where: str) -> dict:
    if cfg["rate"] >= 1.0:
        raise ParamsError(f"{where}.rate: {cfg['rate']!r} would dissolve every class; allowed: 0 <= rate < 1")
    raw_features = body.get("features") or {}
    named_here = sorted({"noise", "method", "seed"} & set(raw_features))
    if named_here and raw_features.get("source") == "run":  # the layout before the run became a DVC edge
        raise ParamsError(f"{where}.features.{named_here[0]}: the run whose embeddings are clustered is named per "
                          "dataset in noise_runs.<dataset>-<noise>: {dataset, noise, run: {noise, method, seed}} "
                          "(so DVC sees the dependency); remove it here")
    cfg["features"] = check_section(cfg["features"], FEATURES_SCHEMA, f"{where}.features")
    feats = cfg["features"]
    own = RUN_FEATURE_KEYS if feats["source"] == "run" else PIXEL_FEATURE_KEYS
    raw = body.get("features") or {}
    for key in set(FEATURES_SCHEMA) - own - {"source"}:
        if key in raw:  # a key of the other source would be silently ignored: refuse it
            raise ParamsError(f"{where}.features.{key}: not used with source {feats['source']!r}; "
                              f"its keys are: {', '.join(sorted(own)) or 'none'}")
    cfg["features"] = {k: v for k, v in feats.items() if k in own or k == "source"}
    return cfg


_RATE = Field(float, min=0.0, max=1.0, help="fraction of training labels to corrupt")
_SEED = Field(int, 0, min=0)

NOISE_KINDS: dict[str, NoiseKind] = {
    "none": NoiseKind(schema={}, apply=_none, description="labels as the dataset gives them (real noise)"),
    "symmetric": NoiseKind(
        schema={"rate": _RATE, "seed": _SEED},
        apply=lambda labels, cfg, inputs: NoiseOutcome(symmetric_noise(labels, cfg["rate"], cfg["seed"])),
        description="each sample flipped with probability rate to a uniformly drawn other class",
    ),
    "symmetric_per_class": NoiseKind(
        schema={"rate": _RATE, "seed": _SEED},
        apply=lambda labels, cfg, inputs: NoiseOutcome(symmetric_per_class_noise(labels, cfg["rate"], cfg["seed"])),
        description="exactly round(rate * n_c) samples of every class flipped to uniformly drawn other classes",
        min_class_size=2,
    ),
    "small_cluster": NoiseKind(
        schema={"rate": Field(float, min=0.0, max=1.0, help="fraction of training images to move"), "seed": _SEED,
                "features": Field(dict, {"source": "pixels"})},
        apply=_small_cluster,
        description="whole classes dissolved into k-means clusters, each sent to a random kept class",
        min_class_size=2,
        extra_check=_check_small_cluster,
    ),
    "published_list": NoiseKind(
        schema={
            "rate": Field(float, min=0.0, max=1.0, help="the rate the lists were published for (the paper's setting)"),
            "noise_model": Field(str, choices=("symmetric", "small_cluster"),
                                 help="the paper's noise model the lists realise (matches the papers' table columns)"),
            "lists": Field(dict, help="per dataset: {noisy_list, kept_list, clean_list, strip_prefix}"),
        },
        apply=_published_list,
        description="the authors' published noisy training list; noisy = absent from their kept list",
        extra_check=check_published_list,
    ),
}


def nominal_rate(cfg: dict) -> float:
    """The rate a noise setting asks for (0 for kinds without a rate)."""
    return float(cfg.get("rate", 0.0))


# --------------------------------------------------------------------------- shared bookkeeping


def check_labels(labels: np.ndarray, kind: NoiseKind, name: str, class_names=None) -> None:
    """Refuse labels a kind cannot work with, before any work."""
    if len(labels) == 0:
        raise NoiseInputError(f"{name} noise: the training split has no samples")
    if labels.min() < 0:
        raise NoiseInputError(f"{name} noise: negative label {labels.min()}")
    sizes = np.bincount(labels)
    small = np.flatnonzero((sizes > 0) & (sizes < kind.min_class_size))
    if len(small):
        c = int(small[0])
        label = f"class {c}" + (f" ({class_names[c]!r})" if class_names is not None else "")
        raise NoiseInputError(
            f"{name} noise: {label} has {sizes[c]} training image(s) ({len(small)} such classes); "
            f"this kind needs at least {kind.min_class_size} per class"
        )


def corrupt_labels(sample_ids: np.ndarray, true_labels: np.ndarray, cfg: dict,
                   inputs: NoiseInputs | None = None, class_names=None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Apply noise setting ``cfg`` to a training set with labels ``0..C-1``.

    Returns

    - the label table ``sample_id, label, true_label, is_noisy``: ``label`` is
      the label training sees, relabelled to ``0..K-1`` over the classes that
      remain; ``true_label`` keeps the original ids ``0..C-1``;
    - the per-class table (:func:`noisydml.noise.stats.per_class_table`);
    - the statistics (:func:`noisydml.noise.stats.noise_stats`).
    """
    from noisydml.noise.stats import noise_stats, per_class_table

    inputs = inputs or NoiseInputs()
    true_labels = np.asarray(true_labels, dtype=np.int64)
    kind = NOISE_KINDS[cfg["kind"]]
    check_labels(true_labels, kind, cfg["kind"], class_names)
    outcome = kind.apply(true_labels, cfg, inputs)
    noisy = np.asarray(outcome.labels, dtype=np.int64)
    is_noisy = noisy != true_labels if outcome.is_noisy is None else np.asarray(outcome.is_noisy, bool)
    remaining = np.unique(noisy)
    dense = np.searchsorted(remaining, noisy)
    table = pd.DataFrame(
        {"sample_id": sample_ids, "label": dense, "true_label": true_labels, "is_noisy": is_noisy.astype(int)}
    )
    per_class = per_class_table(true_labels, noisy, is_noisy, remaining, class_names)
    stats = noise_stats(cfg, per_class, is_noisy, nominal_rate(cfg))
    stats.update(outcome.extra_stats)
    return table, per_class, stats


def check_noise(params: dict, name: str) -> dict:
    """Validate ``noise.<name>`` with its kind's schema (defaults filled in), store it back, return it."""
    check_kinded(params, "noise", name, NOISE_KINDS, "noise")
    return params["noise"][name]
