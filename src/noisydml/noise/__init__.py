"""Label-noise kinds for the ``corrupt`` stage.

A noise kind is a :class:`NoiseKind`: the schema of its params.yaml section and
a function ``apply(true_labels, cfg) -> noisy_labels``. Labels are the
training labels, ``0..C-1``. :func:`corrupt_labels` adds the bookkeeping every
kind shares (the ``is_noisy`` column and statistics). Adding a kind = one entry
in :data:`NOISE_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from noisydml.config import Field
from noisydml.noise.symmetric import symmetric_noise


@dataclass(frozen=True)
class NoiseKind:
    schema: dict[str, Field]
    apply: Callable[[np.ndarray, dict], np.ndarray]
    description: str


def _no_noise(labels: np.ndarray, cfg: dict) -> np.ndarray:
    return labels.copy()


NOISE_KINDS: dict[str, NoiseKind] = {
    "none": NoiseKind(schema={}, apply=_no_noise, description="labels as the dataset gives them"),
    "symmetric": NoiseKind(
        schema={
            "rate": Field(float, min=0.0, max=1.0, help="probability that a sample's label is flipped"),
            "seed": Field(int, 0, min=0),
        },
        apply=lambda labels, cfg: symmetric_noise(labels, cfg["rate"], cfg["seed"]),
        description="each sample flipped with probability rate to a uniformly drawn other class",
    ),
}


def nominal_rate(cfg: dict) -> float:
    """The rate a noise setting asks for (0 for kinds without a rate)."""
    return float(cfg.get("rate", 0.0))


def corrupt_labels(sample_ids: np.ndarray, true_labels: np.ndarray, cfg: dict) -> tuple[pd.DataFrame, dict]:
    """Apply noise setting ``cfg`` to a training set.

    Returns the table ``sample_id, label, true_label, is_noisy`` (``label`` is the
    noisy label training sees) and the statistics written beside it.
    """
    true_labels = np.asarray(true_labels, dtype=np.int64)
    noisy = NOISE_KINDS[cfg["kind"]].apply(true_labels, cfg)
    is_noisy = noisy != true_labels
    table = pd.DataFrame(
        {"sample_id": sample_ids, "label": noisy, "true_label": true_labels, "is_noisy": is_noisy.astype(int)}
    )
    num_classes = int(true_labels.max()) + 1 if len(true_labels) else 0
    flips_per_class = np.bincount(true_labels[is_noisy], minlength=num_classes)
    flip_rate = flips_per_class / np.maximum(np.bincount(true_labels, minlength=num_classes), 1)
    stats = {
        "kind": cfg["kind"],
        "settings": {k: v for k, v in cfg.items() if k != "kind"},
        "nominal_rate": nominal_rate(cfg),
        "actual_rate": float(is_noisy.mean()) if len(is_noisy) else 0.0,
        "num_samples": int(len(true_labels)),
        "num_noisy": int(is_noisy.sum()),
        "num_classes_before": num_classes,
        "num_classes_after": int(len(np.unique(noisy))),
        "flips_per_class": flips_per_class.tolist(),
        "flip_rate_per_class": {
            stat: float(getattr(flip_rate, stat)()) if num_classes else 0.0 for stat in ("min", "mean", "max")
        },
    }
    return table, stats
