"""Nearest neighbours and similarities over dataset-sized sets, never as one N x N matrix.

SOP's 59,551 training images would make a 59,551^2 float matrix of 14 GB; methods
that need neighbours or similarities of the whole training set use these helpers
(faiss for k-NN; on CUDA, faiss's GPU build when installed, else :func:`exact_topk`, an exact blocked torch
search that needs no faiss GPU build and returns what faiss's exact search returns, ties included).
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
    faiss_on_gpu = use_gpu and faiss_gpu_available()
    if use_gpu and not faiss_on_gpu and _cuda_available():
        import torch  # the process's own GPU (one per rank under DDP); faiss's GPU build is not installed

        device = torch.device("cuda", torch.cuda.current_device())
        sims, idx = exact_topk(torch.from_numpy(q).to(device), torch.from_numpy(g).to(device), kk, "ip")
        sims, idx = sims.cpu().numpy(), idx.cpu().numpy()
    else:
        index = faiss.IndexFlatIP(g.shape[1])
        if faiss_on_gpu:
            import torch

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


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


#: Memory of one block of :func:`exact_topk` (ours): the (rows x gallery) scores, their tie bookkeeping and the
#: matrix product's workspace stay within about this many bytes, whatever the dataset's size.
TOPK_BLOCK_BYTES = 1 << 30


def topk_block_rows(gallery: int, block_bytes: int = TOPK_BLOCK_BYTES) -> int:
    """Query rows per block of :func:`exact_topk`: each row holds ``gallery`` float32 scores (twice, transiently,
    for L2), a bool per score, and for the rows with surplus ties a bool and an int32 count more (16 bytes per
    gallery item at most)."""
    return max(1, block_bytes // (16 * max(gallery, 1)))


def exact_topk(queries, gallery, k: int, metric: str, block_bytes: int = TOPK_BLOCK_BYTES):
    """Exact k nearest neighbours in torch, on the tensors' device, a block of query rows at a time; what faiss's
    exact flat index returns, ties included.

    ``metric``: ``"l2"`` = squared L2 distances, smallest first, computed as faiss does (``|q|^2 + |g|^2 - 2 q.g``,
    negatives clamped to 0: ``IndexFlatL2``); ``"ip"`` = inner products, largest first (``IndexFlatIP``).
    Returns ``(scores, indices)``, (queries x k). Never a (queries x gallery) matrix: each block is
    :func:`topk_block_rows` x gallery (``block_bytes``, 1 GiB by default: 17,700 rows at a time against SOP's
    60,502 test images), and the peak is about twice that.

    Ties: of the items tied at the k-th score the lowest indices are taken, and the k are ordered by score, then
    index. That is faiss's rule for ``IndexFlatL2`` (its heap orders by (distance, index); checked on exactly
    representable vectors at k = 1..1023, tests/test_evaluation.py), so evaluation's neighbours are faiss's, ties
    included. ``IndexFlatIP`` on the CPU breaks ties by its blocks' order (measured on faiss 1.15: neither the
    lowest nor the highest indices), so inner-product ties may differ from faiss's. ``torch.topk`` alone picks
    among ties as its kernel happens to (differently on CPU and CUDA), hence the choice by index here. Scores
    differ from faiss's in the last float bits (another matrix-product kernel), so neighbours within that of each
    other may swap: on the 33 committed glyph runs' test embeddings, P@1 and Recall@K are identical, MAP@R within
    5e-6 and R-Precision within 2e-5 (docs/gpu.md).
    """
    import torch

    if metric not in ("l2", "ip"):
        raise ValueError(f"exact_topk: metric {metric!r}; allowed: l2, ip")
    queries, gallery = queries.float(), gallery.float()
    k = min(k, len(gallery))
    # full float32 products: TF32 (on if a caller set torch's matmul precision below "highest") would round the
    # scores to 10-bit mantissas and reorder far more than near-ties
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        return _exact_topk_blocks(queries, gallery, k, metric, block_bytes)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _exact_topk_blocks(queries, gallery, k: int, metric: str, block_bytes: int):
    import torch

    largest = metric == "ip"
    gallery_sq = (gallery * gallery).sum(dim=1) if metric == "l2" else None
    rows = topk_block_rows(len(gallery), block_bytes)
    scores_out = torch.empty(len(queries), k, dtype=torch.float32, device=queries.device)
    index_out = torch.empty(len(queries), k, dtype=torch.int64, device=queries.device)
    for start in range(0, len(queries), rows):
        q = queries[start : start + rows]
        scores = q @ gallery.T
        if metric == "l2":
            scores = ((q * q).sum(dim=1, keepdim=True) + gallery_sq[None, :] - 2 * scores).clamp_(min=0)
        kth = torch.topk(scores, k, dim=1, largest=largest).values[:, -1:]
        chosen = scores >= kth if largest else scores <= kth
        counts = chosen.sum(dim=1)
        if bool((counts < k).any()):  # only NaN compares false with everything
            raise ValueError(f"exact_topk: rows {start}..{start + len(q) - 1} have non-finite scores (NaN or inf in "
                             "the queries or the gallery)")
        surplus = (counts > k).nonzero()[:, 0]
        if len(surplus):  # more items tie at the k-th score than places are left: the lowest indices take them
            tied = scores[surplus] == kth[surplus]
            places = k - (chosen[surplus] & ~tied).sum(dim=1, keepdim=True)
            chosen[surplus] = (chosen[surplus] & ~tied) | (tied & (tied.cumsum(dim=1, dtype=torch.int32) <= places))
            del tied
        index = chosen.nonzero()[:, 1].view(len(q), k)  # row-major: each row's indices ascending
        del chosen
        chosen_scores = scores.gather(1, index)
        del scores
        order = torch.sort(chosen_scores, dim=1, descending=largest, stable=True).indices
        scores_out[start : start + len(q)] = chosen_scores.gather(1, order)
        index_out[start : start + len(q)] = index.gather(1, order)
    return scores_out, index_out


def similarity_blocks(queries, gallery, rows: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, queries[start:start+rows] @ gallery.T)``: a similarity matrix a block of rows at a time."""
    q, g = _as_float32(queries), _as_float32(gallery)
    for start in range(0, len(q), rows):
        yield start, q[start : start + rows] @ g.T
