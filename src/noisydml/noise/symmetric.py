"""Symmetric label noise: the per-sample form (PRISM, SGPS) and the per-class form (BSPML).

Both draw a flipped sample's new label uniformly from the *other* classes,
and both are nested across rates for one seed: what is flipped at a lower rate
is flipped at every higher one. The new labels come from a second random
stream that also depends on the rate, as the PRISM authors' published noisy
lists redraw them per rate.
"""

from __future__ import annotations

import numpy as np

#: Rates enter random streams as integers: 0.2 and 0.2000000001 are the same setting.
RATE_RESOLUTION = 1_000_000


def rate_key(rate: float) -> int:
    return int(round(rate * RATE_RESOLUTION))


def _check_rate(rate: float, what: str) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{what}: rate {rate} outside [0, 1]")


def _relabel_to_other_class(labels: np.ndarray, flip: np.ndarray, classes: np.ndarray, rng) -> np.ndarray:
    """Give each flipped sample a uniformly drawn class other than its own."""
    # Position of each label among the classes; an offset in 1..C-1 never lands on the label itself.
    position = np.searchsorted(classes, labels)
    offsets = rng.integers(1, len(classes), size=len(labels))
    noisy = labels.copy()
    noisy[flip] = classes[(position[flip] + offsets[flip]) % len(classes)]
    return noisy


def symmetric_noise(labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Flip each sample independently with probability ``rate``.

    A sample is flipped when its uniform draw ``u_i`` (a function of the seed
    only) is below the rate, so the flipped sets are nested across rates. The
    number of flips per class is binomial.
    """
    labels = np.asarray(labels, dtype=np.int64)
    _check_rate(rate, "symmetric noise")
    classes = np.unique(labels)
    if rate > 0 and len(classes) < 2:
        raise ValueError("symmetric noise: needs at least 2 classes to flip labels between")
    u = np.random.default_rng([seed, 0]).random(len(labels))
    flip = u < rate
    return _relabel_to_other_class(labels, flip, classes, np.random.default_rng([seed, 1, rate_key(rate)]))


def flips_per_class(class_sizes: np.ndarray, rate: float) -> np.ndarray:
    """``round(rate * n_c)`` (halves rounded up), at least 1 where ``rate > 0``."""
    count = np.floor(rate * class_sizes + 0.5).astype(np.int64)
    if rate > 0:
        count = np.maximum(count, 1)
    return np.minimum(count, class_sizes)


def symmetric_per_class_noise(labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Flip exactly ``round(rate * n_c)`` samples of every class ``c`` (BSPML's protocol).

    Within each class, samples are ranked by a uniform draw that depends on
    the seed only, and the lowest-ranked ones are flipped; the count grows
    with the rate, so the flipped sets are nested across rates.
    """
    labels = np.asarray(labels, dtype=np.int64)
    _check_rate(rate, "symmetric_per_class noise")
    classes, dense, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    if rate > 0 and len(classes) < 2:
        raise ValueError("symmetric_per_class noise: needs at least 2 classes to flip labels between")
    u = np.random.default_rng([seed, 0]).random(len(labels))
    order = np.lexsort((u, dense))  # by class, then by the draw
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(len(labels), dtype=np.int64)
    rank[order] = np.arange(len(labels)) - np.repeat(starts, sizes)
    flip = rank < flips_per_class(sizes, rate)[dense]
    return _relabel_to_other_class(labels, flip, classes, np.random.default_rng([seed, 1, rate_key(rate)]))
