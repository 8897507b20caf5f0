"""Small-cluster (open-set) label noise, as PRISM (Table 2) and SGPS (Table II) use it.

1. Whole training classes are picked in a random order (a function of the seed
   only) and dissolved until the number of dissolved images first reaches
   ``rate * N``. The dissolved set at a lower rate is a prefix of the one at a
   higher rate, so it is nested across rates.
2. Each dissolved class of ``n`` images is split by k-means on image features
   into ``floor(n / 2)`` clusters (so clusters of one to a few images).
3. Every non-empty cluster goes to one uniformly drawn *kept* class.

The dissolved classes disappear, so the class count drops (CUB 100 -> 75 at
0.25); :func:`noisydml.noise.corrupt_labels` relabels to ``0..K-1``. The moved
images belong to no remaining class: open-set noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from noisydml.data import DatasetError
from noisydml.noise.symmetric import rate_key


class NoiseInputError(DatasetError):
    """Labels, features or a rate that a noise kind cannot work with (stages exit 1 with the message)."""


@dataclass
class SmallClusterResult:
    labels: np.ndarray          # noisy labels, in the original class ids
    dissolved: np.ndarray       # original ids of the dissolved classes, in dissolution order
    cluster_sizes: np.ndarray   # size of every moved (non-empty) cluster
    cluster_targets: np.ndarray  # the kept class each cluster was sent to


def dissolution_order(classes: np.ndarray, seed: int) -> np.ndarray:
    """The order in which classes are dissolved; depends on the seed only (nesting)."""
    return np.random.default_rng([seed, 0]).permutation(classes)


def dissolved_classes(labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Classes dissolved at ``rate``: the shortest prefix of the order holding ``>= rate * N`` images."""
    classes, sizes = np.unique(labels, return_counts=True)
    order = dissolution_order(classes, seed)
    size_of = dict(zip(classes.tolist(), sizes.tolist()))
    cumulative = np.cumsum([size_of[c] for c in order.tolist()])
    target = rate * len(labels)
    # first prefix length whose image count reaches the target (0 classes when rate = 0)
    count = 0 if target <= 0 else int(np.searchsorted(cumulative, target - 1e-9 * len(labels), side="left")) + 1
    if count >= len(classes):
        reach = f"; dissolving all but one reaches only {cumulative[-2] / len(labels):.4f}" if len(classes) > 1 else ""
        raise NoiseInputError(
            f"small_cluster noise: rate {rate} would dissolve every one of the {len(classes)} classes "
            f"({len(labels)} images{reach}); use a lower rate"
        )
    return order[:count]


def _kmeans_assign(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    import faiss

    if k == 1:
        return np.zeros(len(x), dtype=np.int64)
    km = faiss.Kmeans(x.shape[1], k, niter=20, seed=seed, min_points_per_centroid=1, verbose=False)
    km.train(x)
    _, assign = km.index.search(x, 1)
    return assign.ravel().astype(np.int64)


def small_cluster_noise(labels: np.ndarray, rate: float, seed: int, features: np.ndarray,
                        progress: bool = False) -> SmallClusterResult:
    """Dissolve classes into small clusters and scatter them over the kept classes.

    ``features[i]`` describes sample ``i`` (pixels after PCA, or a model's
    embeddings). Per-class clustering is seeded by ``(seed, class)``, so a
    class dissolved at two rates is cut into the same clusters; only the
    destinations are redrawn per rate.
    """
    import faiss

    labels = np.asarray(labels, dtype=np.int64)
    if not 0.0 <= rate < 1.0:
        raise NoiseInputError(f"small_cluster noise: rate {rate} outside [0, 1)")
    features = np.ascontiguousarray(features, dtype=np.float32)
    if features.ndim != 2 or len(features) != len(labels):
        raise NoiseInputError(
            f"small_cluster noise: features of shape {features.shape} do not match {len(labels)} labels"
        )
    if not np.isfinite(features).all():
        raise NoiseInputError("small_cluster noise: features contain NaN or infinite values")
    classes, sizes = np.unique(labels, return_counts=True)
    if (sizes < 2).any():
        lonely = classes[sizes < 2]
        raise NoiseInputError(
            f"small_cluster noise: class {lonely[0]} has a single image ({len(lonely)} such classes); "
            "every class needs at least 2 images to be cut into clusters"
        )
    dissolved = dissolved_classes(labels, rate, seed)
    kept = np.setdiff1d(classes, dissolved)
    target_rng = np.random.default_rng([seed, 3, rate_key(rate)])
    noisy = labels.copy()
    sizes_out, targets_out = [], []
    # Many tiny problems: one thread avoids OpenMP start-up costs and keeps results
    # independent of the machine's core count.
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        members_of = _members_by_class(labels)
        iterator = dissolved.tolist()
        if progress:
            from tqdm import tqdm

            iterator = tqdm(iterator, desc="small-cluster k-means", unit="class", leave=False)
        for c in iterator:
            members = members_of[c]
            k = len(members) // 2
            class_seed = int(np.random.default_rng([seed, 2, c]).integers(2**31 - 1))
            assign = _kmeans_assign(features[members], k, class_seed)
            used = np.unique(assign)
            targets = kept[target_rng.integers(0, len(kept), size=len(used))]
            for cluster, target in zip(used, targets):
                in_cluster = members[assign == cluster]
                noisy[in_cluster] = target
                sizes_out.append(len(in_cluster))
                targets_out.append(target)
    finally:
        faiss.omp_set_num_threads(threads)
    return SmallClusterResult(noisy, dissolved, np.asarray(sizes_out, np.int64), np.asarray(targets_out, np.int64))


def _members_by_class(labels: np.ndarray) -> dict[int, np.ndarray]:
    order = np.argsort(labels, kind="stable")
    classes, starts = np.unique(labels[order], return_index=True)
    ends = np.append(starts[1:], len(labels))
    return {int(c): order[s:e] for c, s, e in zip(classes, starts, ends)}
