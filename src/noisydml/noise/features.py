"""Image features for small-cluster noise: PCA of pixels, or a finished run's embeddings.

- ``pixels`` (default, offline): images shrunk by area averaging to at most
  ``pixel_side`` x ``pixel_side``, flattened, scaled to [0, 1], then reduced
  to ``pca_dim`` dimensions by PCA (scikit-learn, covariance eigensolver:
  deterministic, and 6x faster here than faiss's PCAMatrix on 3,072-d
  pixels) fitted on at most ``PCA_FIT_SAMPLES`` training images.
- ``run``: the training-set embeddings a finished run of the same dataset
  wrote (``runs/<dataset>/<noise>/<method>/seed<k>/train_embeddings.npz``).
  Rows are matched by sample id; any mismatch with the manifest is an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from noisydml.data.prepared import sha256_file
from noisydml.noise.small_cluster import NoiseInputError

PCA_FIT_SAMPLES = 20_000


def shrink(images: np.ndarray, side: int) -> np.ndarray:
    """``(N, H, W, C)`` uint8 -> ``(N, h, w, C)`` float32 in [0, 1], ``h, w <= side``, by area averaging."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0)
    h, w = x.shape[-2:]
    if h > side or w > side:
        x = torch.nn.functional.adaptive_avg_pool2d(x, (min(h, side), min(w, side)))
    return x.permute(0, 2, 3, 1).contiguous().numpy()


def pixel_features(images: np.ndarray, pca_dim: int, pixel_side: int, seed: int, batch: int = 4096) -> np.ndarray:
    """PCA-reduced pixels of ``images`` (``(N, pca_dim)`` float32)."""
    from sklearn.decomposition import PCA

    n = len(images)
    dim = int(np.prod(shrink(images[:1], pixel_side).shape[1:])) if n else 0
    if pca_dim > dim:
        raise NoiseInputError(
            f"small_cluster features: pca_dim {pca_dim} is larger than the {dim} pixel values per image "
            f"(after shrinking to at most {pixel_side}x{pixel_side}); lower pca_dim or raise pixel_side"
        )
    if pca_dim > n:
        raise NoiseInputError(
            f"small_cluster features: pca_dim {pca_dim} is larger than the {n} training images PCA is fitted on; "
            "lower pca_dim"
        )
    fit_rows = np.sort(np.random.default_rng([seed, 4]).permutation(n)[:PCA_FIT_SAMPLES])
    fit = shrink(np.asarray(images[fit_rows]), pixel_side).reshape(len(fit_rows), -1)
    solver = "covariance_eigh" if len(fit_rows) > dim else "full"
    pca = PCA(n_components=pca_dim, svd_solver=solver).fit(fit)
    out = np.empty((n, pca_dim), np.float32)
    for start in range(0, n, batch):
        block = shrink(np.asarray(images[start:start + batch]), pixel_side).reshape(-1, dim)
        out[start:start + batch] = pca.transform(block)
    return out


def run_features(path: Path, sample_ids: np.ndarray, run: str) -> tuple[np.ndarray, str]:
    """The embeddings of ``sample_ids`` from a run's ``train_embeddings.npz``, and the file's sha256."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing. small_cluster features come from run {run}, which has not finished; "
            f"train it first (`dvc repro train@{run}`), then run `dvc repro` again"
        )
    data = np.load(path)
    for key in ("embeddings", "sample_ids"):
        if key not in data:
            raise NoiseInputError(f"{path}: has no {key!r} array; re-run the train stage of {run}")
    emb, ids = data["embeddings"], data["sample_ids"]
    if emb.ndim != 2 or len(emb) != len(ids):
        raise NoiseInputError(f"{path}: {emb.shape} embeddings for {len(ids)} sample ids")
    if not np.array_equal(np.sort(ids), np.sort(sample_ids)) or len(ids) != len(sample_ids):
        missing = np.setdiff1d(sample_ids, ids)
        raise NoiseInputError(
            f"{path}: features do not match the manifest's training split: {len(ids)} rows for "
            f"{len(sample_ids)} training samples"
            + (f", sample {missing[0]} has none" if len(missing) else ", with ids outside the training split")
        )
    row_of = np.empty(int(ids.max()) + 1, np.int64)
    row_of[ids] = np.arange(len(ids))
    return np.asarray(emb[row_of[sample_ids]], np.float32), sha256_file(path)
