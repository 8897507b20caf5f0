"""Nearest neighbours and similarities over dataset-sized sets, never as one N x N matrix.

SOP's 59,551 training images would make a 59,551^2 float matrix of 14 GB; methods
that need neighbours or similarities of the whole training set use these helpers
(faiss for k-NN, on the GPU when faiss has GPU support and the run is on CUDA).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


def _as_float32(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def faiss_gpu_available() -> bool:
    """Whether faiss can search on a GPU here: its GPU build is installed and sees a device."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def knn(queries, k: int, gallery=None, use_gpu: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest inner products of each query over the gallery: ``(similarities, indices)``, (Q, k).

    With no gallery, the gallery is the queries and each query's own row is excluded. Exact search
    (``IndexFlatIP``); on unit vectors the inner product is the cosine similarity.
    """
    import faiss

    q = _as_float32(queries)
    self_search = gallery is None
    g = q if self_search else _as_float32(gallery)
    kk = min(k + 1 if self_search else k, len(g))
    index = faiss.IndexFlatIP(g.shape[1])
    if use_gpu and faiss_gpu_available():
        import torch  # the process's own GPU (one per rank under DDP)

        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), torch.cuda.current_device(), index)
    index.add(g)
    sims, idx = index.search(q, kk)
    if not self_search:
        return sims, idx
    # drop each query's own row (wherever ties put it), keep k
    own = idx == np.arange(len(q))[:, None]
    missing_self = ~own.any(axis=1)
    own[missing_self, -1] = True  # self not retrieved (ties): drop the last instead
    keep = ~own
    width = kk - 1
    return sims[keep].reshape(len(q), width)[:, :k], idx[keep].reshape(len(q), width)[:, :k]


def similarity_blocks(queries, gallery, rows: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, queries[start:start+rows] @ gallery.T)``: a similarity matrix a block of rows at a time."""
    q, g = _as_float32(queries), _as_float32(gallery)
    for start in range(0, len(q), rows):
        yield start, q[start : start + rows] @ g.T
