"""BSPML's weight step at SOP size: the xi pass (exact and top-k) and Alg. 3's coordinate loop; prints figures.

    python scripts/bench_bspml.py [--samples 59551 --classes 11318 --dim 512 --topk 512 --threads 2]

A problem shaped like SOP's training split (59,551 images, 11,318 classes, 512-d unit embeddings around
class centres) is made up; then, timed on this machine:

- the matrix-product lower bound of an exact xi- pass: every block of rows times the whole set, nothing else;
- the exact xi- pass of Eq. 3 (blocked: never an N x N matrix) and the xi+ pass (class by class);
- xi- from each row's top-k neighbours (faiss, exact search) and its error against the exact value on a
  sample of rows (the approximation only drops terms, so it is a lower bound);
- one weight step of Alg. 3 (3 passes over N coordinates, block 256) given xi.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from noisydml.methods.parts.bspml import (
    ClassIndex, weight_step, xi_negative, xi_negative_topk, xi_positive,
)
from noisydml.neighbours import knn, similarity_blocks


def _problem(samples: int, classes: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # every class gets at least 2 images (SOP's smallest classes have 2), the rest spread at random
    labels = np.concatenate([np.repeat(np.arange(classes), 2), rng.integers(0, classes, samples - 2 * classes)])
    # class centres in an 8-d subspace, so that neighbouring classes are close: hard negatives with
    # similarities near rho, where Eq. 3's exp(beta (S - rho)) is not negligible
    centres = (rng.standard_normal((classes, 8)) @ rng.standard_normal((8, dim))).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    emb = centres[labels] + 0.005 * rng.standard_normal((samples, dim)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return emb, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=59551)
    parser.add_argument("--classes", type=int, default=11318)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--topk", type=int, default=512)
    parser.add_argument("--error-rows", type=int, default=2048, help="rows on which the top-k error is measured")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--alpha", type=float, default=2.0)
    parser.add_argument("--beta", type=float, default=50.0)
    parser.add_argument("--base", type=float, default=1.0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    emb, labels = _problem(args.samples, args.classes, args.dim)
    index = ClassIndex.of(labels)
    print(f"problem: {args.samples:,} rows, {args.classes:,} classes, {args.dim}-d; torch threads "
          f"{torch.get_num_threads()}")

    t = time.perf_counter()
    for _, block in similarity_blocks(emb, emb, 2048):
        pass
    gemm = time.perf_counter() - t
    print(f"matrix-product lower bound of an exact xi- pass: {gemm:7.1f} s "
          f"({2 * args.samples ** 2 * args.dim / gemm / 1e9:.0f} GFLOP/s)")

    t = time.perf_counter()
    xi_pos = xi_positive(emb, index, args.alpha, args.base)
    print(f"xi+ pass (class by class):                       {time.perf_counter() - t:7.1f} s")
    t = time.perf_counter()
    xi_neg = xi_negative(emb, labels, args.beta, args.base, similarity_blocks)
    exact_seconds = time.perf_counter() - t
    print(f"xi- pass, exact (blocks of 2,048 rows):          {exact_seconds:7.1f} s")
    t = time.perf_counter()
    approx = xi_negative_topk(emb, labels, args.beta, args.base, args.topk, knn)
    print(f"xi- pass, top-{args.topk} neighbours (faiss, exact search): {time.perf_counter() - t:7.1f} s")
    rows = np.random.default_rng(1).choice(args.samples, min(args.error_rows, args.samples), replace=False)
    err = np.abs(approx[rows] - xi_neg[rows])
    rel = err / np.maximum(np.abs(xi_neg[rows]), 1e-12)
    print(f"  top-{args.topk} error on {len(rows):,} rows: max abs {err.max():.3e}, mean abs {err.mean():.3e}, "
          f"max relative {rel.max():.3e} (exact xi- mean {xi_neg.mean():.4f}, xi+ mean {xi_pos.mean():.4f})")

    # an age in the middle of the expected gradients, so that weights move
    lam = float(np.median(2 * xi_pos + 2 * xi_neg))
    t = time.perf_counter()
    w = weight_step(np.ones(args.samples), xi_pos, xi_neg, index, lam=lam, mu=lam, step_size=0.1, passes=3,
                    classes=16, per_class=16, block=256, rng=np.random.default_rng(0))
    print(f"Alg. 3, one weight step (3 passes x {args.samples:,} coordinates, P = K = 16, block 256, lambda "
          f"{lam:.2f}): {time.perf_counter() - t:.2f} s (mean weight after it {w.mean():.3f})")


if __name__ == "__main__":
    main()
