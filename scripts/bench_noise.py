"""Benchmark: time of each label-noise generator on an SOP-sized training set.

SOP's training split has 59,551 images in 11,318 classes of 2 to 12 images.
The script draws class sizes in that range with that total, 128-d features
with class structure, and times every kind through
:func:`noisydml.noise.corrupt_labels` (the generator plus the relabelling and
the statistics the corrupt stage writes), at the papers' rates. It also times
the default small-cluster features: PCA of 32x32 RGB pixels of as many images.

    python scripts/bench_noise.py
    python scripts/bench_noise.py --samples 5894 --classes 100   # CUB-sized
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from noisydml.noise import NoiseInputs, corrupt_labels
from noisydml.noise.features import pixel_features


def sop_like_labels(samples: int, classes: int, max_size: int, seed: int) -> np.ndarray:
    """Class sizes in [2, max_size] summing to ``samples`` (small classes most common, as in SOP),
    in a shuffled sample order."""
    rng = np.random.default_rng(seed)
    if classes * 2 > samples or classes * max_size < samples:
        raise SystemExit(f"{samples} samples cannot fill {classes} classes of 2..{max_size}")
    choices = np.arange(2, max_size + 1)
    weights = np.exp(-choices / 3.0)
    sizes = rng.choice(choices, size=classes, p=weights / weights.sum())
    while (gap := samples - sizes.sum()) != 0:  # nudge random classes until the total is exact
        room = np.flatnonzero(sizes < max_size) if gap > 0 else np.flatnonzero(sizes > 2)
        pick = rng.choice(room, size=min(abs(gap), len(room)), replace=False)
        sizes[pick] += 1 if gap > 0 else -1
    return rng.permutation(np.repeat(np.arange(classes), sizes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=59_551)
    parser.add_argument("--classes", type=int, default=11_318)
    parser.add_argument("--max-size", type=int, default=12)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    labels = sop_like_labels(args.samples, args.classes, args.max_size, args.seed)
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((args.classes, args.dim)).astype(np.float32)
    features = centres[labels] + 0.5 * rng.standard_normal((len(labels), args.dim)).astype(np.float32)
    inputs = NoiseInputs(features=lambda cfg: (features, {"source": "benchmark"}))
    sizes = np.bincount(labels)
    print(f"{len(labels):,} samples, {args.classes:,} classes (sizes {sizes.min()}-{sizes.max()}, "
          f"mean {sizes.mean():.2f}), {args.dim}-d features\n")
    print(f"{'kind':<22}{'rate':>6}{'seconds':>10}{'actual rate':>13}{'classes after':>15}{'moved clusters':>16}")
    settings = [("symmetric", r) for r in (0.1, 0.2, 0.5)]
    settings += [("symmetric_per_class", r) for r in (0.1, 0.2, 0.5)]
    settings += [("small_cluster", r) for r in (0.25, 0.5, 0.75)]
    for kind, rate in settings:
        cfg = {"kind": kind, "rate": rate, "seed": 0}
        if kind == "small_cluster":
            cfg["features"] = {"source": "pixels"}
        t0 = time.perf_counter()
        _, _, stats = corrupt_labels(np.arange(len(labels)), labels, cfg, inputs)
        seconds = time.perf_counter() - t0
        clusters = stats.get("moved_clusters", {}).get("count", "-")
        print(f"{kind:<22}{rate:>6.2f}{seconds:>10.2f}{stats['actual_rate']:>13.4f}"
              f"{stats['num_classes_after']:>15,}{clusters:>16}")

    images = np.random.default_rng(1).integers(0, 256, size=(len(labels), 32, 32, 3), dtype=np.uint8)
    t0 = time.perf_counter()
    pixel_features(images, pca_dim=32, pixel_side=32, seed=0)
    print(f"\npixel features (PCA of {len(labels):,} 32x32x3 images to 32 dims): {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
