"""Symmetric label noise, as PRISM and SGPS define it.

Each training sample is flipped independently with probability ``rate``; a
flipped sample's new label is drawn uniformly from the *other* classes.

The flipped sets are nested across rates for one seed: a sample is flipped
when its uniform draw ``u_i`` (which depends on the seed only) is below the
rate, so the samples flipped at 0.2 are among those flipped at 0.5. The new
labels are drawn from a second stream that also depends on the rate, as the
published PRISM noisy lists redraw them per rate.
"""

from __future__ import annotations

import numpy as np


def symmetric_noise(labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"symmetric noise: rate {rate} outside [0, 1]")
    classes = np.unique(labels)
    if rate > 0 and len(classes) < 2:
        raise ValueError("symmetric noise: needs at least 2 classes to flip labels between")
    u = np.random.default_rng([seed, 0]).random(len(labels))
    flip = u < rate
    # Position of each label among the classes; an offset in 1..C-1 never lands on the label itself.
    position = np.searchsorted(classes, labels)
    rate_key = int(round(rate * 1_000_000))
    offsets = np.random.default_rng([seed, 1, rate_key]).integers(1, len(classes), size=len(labels))
    noisy = labels.copy()
    noisy[flip] = classes[(position[flip] + offsets[flip]) % len(classes)]
    return noisy
