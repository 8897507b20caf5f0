"""Benchmark: time to compute every retrieval metric on an SOP-sized test set.

Prints the time of :func:`noisydml.evaluation.retrieval.retrieval_metrics`
(faiss exact k-NN + AccuracyCalculator + faiss k-means NMI) for N random
unit-norm D-d embeddings in C classes, and a plain matrix-product lower bound
for the same size: the N x N similarity matrix computed block by block (any
exact k-NN must at least do this product).

    python scripts/bench_eval.py            # 60,000 x 128-d, 11,000 classes
    python scripts/bench_eval.py --n 5000   # quicker
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from noisydml.evaluation.retrieval import retrieval_metrics


def matmul_lower_bound(emb: torch.Tensor, block: int = 4096) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(emb), block):
        sims = emb[i : i + block] @ emb.T
        del sims
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=11_000)
    parser.add_argument("--no-nmi", action="store_true", help="skip k-means NMI")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    labels = rng.integers(0, args.classes, size=args.n)
    emb = rng.standard_normal((args.n, args.dim)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    print(f"{args.n} embeddings, {args.dim}-d, {len(np.unique(labels))} classes, "
          f"largest class {np.bincount(labels).max()}, torch threads {torch.get_num_threads()}")

    t0 = time.perf_counter()
    metrics = retrieval_metrics(emb, labels, recall_at=(1, 10, 100), nmi=not args.no_nmi)
    total = time.perf_counter() - t0
    t0 = time.perf_counter()
    retrieval_metrics(emb, labels, recall_at=(1, 10, 100), nmi=False)
    knn_only = time.perf_counter() - t0
    bound = matmul_lower_bound(torch.from_numpy(emb))
    gflop = 2 * args.n * args.n * args.dim / 1e9

    print(f"all retrieval metrics{'' if args.no_nmi else ' (incl. NMI)'}: {total:8.2f} s")
    print(f"  of which k-NN metrics only:          {knn_only:8.2f} s   (NMI k-means: {total - knn_only:.2f} s)")
    print(f"matrix-product lower bound ({gflop:.0f} GFLOP): {bound:8.2f} s   ({gflop / bound:.0f} GFLOP/s)")
    print(f"ratio k-NN metrics / lower bound:      {knn_only / bound:8.2f}")
    print("metrics (random embeddings, so near chance):", {k: round(v, 4) for k, v in metrics.items()})


if __name__ == "__main__":
    main()
