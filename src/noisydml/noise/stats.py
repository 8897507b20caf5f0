"""Noise statistics: what a noise setting did to the training labels.

Two views per class ``c`` of the original classes:

- *flip-out rate*: the share of ``c``'s own images whose label was changed
  (1 for a class small-cluster noise dissolved);
- *impurity*: the share of the samples training sees under label ``c`` that
  are not truly ``c``: the label noise a class's positives carry.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def per_class_table(true_labels: np.ndarray, noisy: np.ndarray, is_noisy: np.ndarray, remaining: np.ndarray,
                    class_names=None) -> pd.DataFrame:
    num_classes = int(true_labels.max()) + 1
    images = np.bincount(true_labels, minlength=num_classes)
    flipped_out = np.bincount(true_labels[is_noisy], minlength=num_classes)
    labelled = np.bincount(noisy, minlength=num_classes)[:num_classes]
    foreign = np.bincount(noisy[is_noisy], minlength=num_classes)[:num_classes]
    new_label = np.full(num_classes, -1, np.int64)
    new_label[remaining[remaining < num_classes]] = np.arange(int((remaining < num_classes).sum()))
    with np.errstate(invalid="ignore", divide="ignore"):
        table = pd.DataFrame({
            "true_label": np.arange(num_classes),
            "class_name": class_names if class_names is not None else [""] * num_classes,
            "images": images,
            "flipped_out": flipped_out,
            "flip_out_rate": np.where(images > 0, flipped_out / np.maximum(images, 1), np.nan),
            "label": new_label,
            "labelled": labelled,
            "foreign": foreign,
            "impurity": np.where(labelled > 0, foreign / np.maximum(labelled, 1), np.nan),
        })
    return table


def _summary(values: pd.Series) -> dict:
    values = values.dropna()
    if values.empty:
        return {"min": None, "mean": None, "max": None}
    return {"min": float(values.min()), "mean": float(values.mean()), "max": float(values.max())}


def noise_stats(cfg: dict, per_class: pd.DataFrame, is_noisy: np.ndarray, nominal: float) -> dict:
    present = per_class[per_class["images"] > 0]
    flips, counts = np.unique(present["flipped_out"].to_numpy(), return_counts=True)
    remaining = per_class[per_class["label"] >= 0]
    return {
        "kind": cfg["kind"],
        "settings": {k: v for k, v in cfg.items() if k != "kind"},
        "nominal_rate": nominal,
        "actual_rate": float(is_noisy.mean()) if len(is_noisy) else 0.0,
        "num_samples": int(len(is_noisy)),
        "num_noisy": int(is_noisy.sum()),
        "num_classes_before": int(len(present)),
        "num_classes_after": int(len(remaining)),
        # number of classes that lost k of their own images, for each k
        "flips_per_class_histogram": {str(int(f)): int(c) for f, c in zip(flips, counts)},
        "flip_rate_per_class": _summary(present["flip_out_rate"]),
        "impurity_per_class": _summary(remaining["impurity"]),
    }
