"""Face verification of a trained run: its model embeds a ``faces`` dataset's verification sets, read through the
real readers (insightface ``.bin`` files, IJB meta files and crops), scored by the protocols of
:mod:`noisydml.evaluation.verification`.

What the run's retrieval ranks with is what verification compares (:attr:`Method.retrieval`: the embeddings, or
the L2-normalised backbone features of a classifier). The train stage keeps the features
(:func:`verification_embeddings`), the evaluate stage scores them (:func:`verification_metrics`), beside the
retrieval metrics of the identity-disjoint test split, never instead of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from noisydml import io
from noisydml.data.face_formats import IJBMeta, decode_images, read_ijb_images, read_verification_bin
from noisydml.evaluation.verification import (VERIFICATION_FARS, flip_summed, pair_scores, tar_at_far,
                                              template_features, ten_fold_accuracy)


def verification_sets(prepared_dir: str | Path) -> list[str]:
    """The ``.bin`` sets a prepared ``faces`` folder carries (``verification/<set>.bin``)."""
    folder = Path(prepared_dir) / "verification"
    return sorted(p.stem for p in folder.glob("*.bin")) if folder.is_dir() else []


#: A run folder's verification features (written by the train stage when its dataset has verification sets).
VERIFICATION_EMBEDDINGS = "verification_embeddings.npz"


def model_embedder(model: "torch.nn.Module", retrieval: str, train_cfg: dict, runtime: dict, seed: int):
    """``images (N, H, W, C) uint8 -> (N, d) float64``: ``model`` through the run's eval input pipeline, ranking
    with what the method's retrieval ranks with (``retrieval``: embeddings | features)."""
    from noisydml.data.images import InputPipeline
    from noisydml.engine.embedding import embed

    device = next(model.parameters()).device
    pipeline = InputPipeline.from_params(train_cfg, runtime, seed, device)
    in_channels = next(p for p in model.parameters() if p.ndim == 4).shape[1]
    features = retrieval == "features"

    def embedder(images: np.ndarray) -> np.ndarray:
        if images.shape[-1] != in_channels:  # a grey model sees the mean of the channels
            images = images.mean(-1, keepdims=True).round().astype(np.uint8)
        out = embed(model, np.ascontiguousarray(images), device, features=features, pipeline=pipeline)
        return (out[1] if features else out).double().numpy()

    return embedder


def _with_flip(embedder, images: np.ndarray) -> np.ndarray:
    return flip_summed(embedder(images), embedder(np.ascontiguousarray(images[:, :, ::-1])))


def verification_embeddings(embedder, prepared_dir: str | Path) -> dict[str, np.ndarray]:
    """What a run keeps of the verification sets: per ``.bin`` set its image + flip features (``<set>_features``,
    float32, 2P rows) and pair flags (``<set>_issame``); for the IJB set its template ids and template-pooled
    features. Images are read at the prepared dataset's image size."""
    prepared_dir = Path(prepared_dir)
    folder = prepared_dir / "verification"
    info = io.read_json(prepared_dir / "info.json")
    size = int(info["image_shape"][0])
    out: dict[str, np.ndarray] = {}
    for name in verification_sets(prepared_dir):
        bins, issame = read_verification_bin(folder / f"{name}.bin")
        out[f"{name}_features"] = _with_flip(embedder, decode_images(bins, size)).astype(np.float32)
        out[f"{name}_issame"] = issame
    if (folder / "IJB").is_dir():
        meta = IJBMeta.read(folder / "IJB", info.get("ijb_name", "ijbc"))
        feats = _with_flip(embedder, read_ijb_images(folder / "IJB", meta, size))
        ids, templates = template_features(feats, meta.images["template"].to_numpy(), meta.images["media"].to_numpy())
        out["ijb_template_ids"], out["ijb_template_features"] = ids, templates.astype(np.float32)
    return out


def verification_metrics(saved: dict, prepared_dir: str | Path) -> dict:
    """The protocols' numbers (%) from a run's :data:`VERIFICATION_EMBEDDINGS` (``saved``) and, for the IJB set,
    the template pairs of the prepared folder: ``<set>_accuracy`` / ``<set>_accuracy_std`` (10 folds),
    ``tar_at_far_<f>`` with ``_low`` / ``_high`` (Wilson 95 %) and ``_false_accepts``."""
    out: dict = {}
    for key in sorted(k for k in saved if k.endswith("_issame")):
        name = key[: -len("_issame")]
        acc = ten_fold_accuracy(np.asarray(saved[f"{name}_features"], np.float64), saved[key])
        out[f"{name}_accuracy"], out[f"{name}_accuracy_std"] = 100 * acc.mean, 100 * acc.std
    if "ijb_template_ids" in saved:
        prepared_dir = Path(prepared_dir)
        info = io.read_json(prepared_dir / "info.json")
        meta = IJBMeta.read(prepared_dir / "verification" / "IJB", info.get("ijb_name", "ijbc"))
        feats = np.asarray(saved["ijb_template_features"], np.float64)
        scores = pair_scores(saved["ijb_template_ids"], feats, meta.pairs["template1"].to_numpy(),
                             meta.pairs["template2"].to_numpy())
        for r in tar_at_far(scores, meta.pairs["label"].to_numpy(), VERIFICATION_FARS):
            key = f"tar_at_far_{r.far:g}"
            out[key] = 100 * r.tar
            out[f"{key}_low"], out[f"{key}_high"] = 100 * r.tar_low, 100 * r.tar_high
            out[f"{key}_false_accepts"] = r.false_accepts
    return out
