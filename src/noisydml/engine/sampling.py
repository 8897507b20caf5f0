"""The P x K batches of an epoch: pytorch-metric-learning's MPerClassSampler, re-seeded every epoch by (seed,
epoch), so a resumed run draws the same batches as an uninterrupted one."""

from __future__ import annotations

import numpy as np
from pytorch_metric_learning.samplers import MPerClassSampler
from pytorch_metric_learning.utils import common_functions as pml_common


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of ``epoch`` of a run seeded ``seed``: its batches and its torch generator."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per epoch: about one pass over the data (at least one batch)."""
    return max(num_samples, batch_size) // batch_size


def epoch_batches(labels: np.ndarray, per_class: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The P x K batches of one epoch (about one pass over the data), seeded by (seed, epoch).

    MPerClassSampler draws from the module-level numpy RNG of pytorch-metric-learning; it is
    swapped for a seeded one while the epoch's indices are drawn, then restored.
    """
    sampler = MPerClassSampler(labels, m=per_class, batch_size=batch_size,
                               length_before_new_iter=steps_per_epoch(len(labels), batch_size) * batch_size)
    saved = pml_common.NUMPY_RANDOM
    pml_common.NUMPY_RANDOM = np.random.RandomState(epoch_seed(seed, epoch) % (2**32))
    try:
        indices = np.fromiter(iter(sampler), dtype=np.int64)
    finally:
        pml_common.NUMPY_RANDOM = saved
    return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
