"""What a face run keeps for verification: its final model's features of a ``faces`` dataset's verification images.

The train stage calls this when the run's prepared dataset has verification sets (``verification/<set>.bin``,
``verification/IJB``). It only embeds: every image and its horizontal flip, raw (not normalised), read through
the real readers (insightface ``.bin`` files; IJB meta files and crops, aligned). How the features are combined
and scored is the protocols' business, in the evaluate stage (:mod:`noisydml.pipeline.face_eval`), so a change of
protocol re-evaluates runs without retraining them.

What retrieval ranks with is what verification compares (:attr:`Method.retrieval`: the embeddings, or the backbone
features of a classifier).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from noisydml import io
from noisydml.data.face_formats import IJBMeta, decode_images, read_ijb_images, read_verification_bin

#: A run folder's verification features (written by the train stage when its dataset has verification sets).
VERIFICATION_EMBEDDINGS = "verification_embeddings.npz"


def verification_sets(prepared_dir: str | Path) -> list[str]:
    """The ``.bin`` sets a prepared ``faces`` folder carries (``verification/<set>.bin``)."""
    folder = Path(prepared_dir) / "verification"
    return sorted(p.stem for p in folder.glob("*.bin")) if folder.is_dir() else []


def has_verification(prepared_dir: str | Path) -> bool:
    return bool(verification_sets(prepared_dir)) or (Path(prepared_dir) / "verification" / "IJB").is_dir()


def model_embedder(model, retrieval: str, train_cfg: dict, runtime: dict, seed: int):
    """``images (N, H, W, C) uint8 -> (N, d) float32``: ``model`` through the run's eval input pipeline, giving
    what the method's retrieval ranks with (``retrieval``: embeddings | features)."""
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
        return (out[1] if features else out).float().numpy()

    return embedder


def _image_and_flip(embedder, images: np.ndarray, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}_image": embedder(images),
            f"{prefix}_flip": embedder(np.ascontiguousarray(images[:, :, ::-1]))}


def verification_embeddings(embedder, prepared_dir: str | Path) -> dict[str, np.ndarray]:
    """Per ``.bin`` set its 2P images' and their flips' features (``<set>_image``, ``<set>_flip``) and pair flags
    (``<set>_issame``); for the IJB set every image's and flip's features in the meta file's order
    (``ijb_image``, ``ijb_flip``). Images are read at the prepared dataset's image size."""
    prepared_dir = Path(prepared_dir)
    folder = prepared_dir / "verification"
    info = io.read_json(prepared_dir / "info.json")
    size = int(info["image_shape"][0])
    out: dict[str, np.ndarray] = {}
    for name in verification_sets(prepared_dir):
        bins, issame = read_verification_bin(folder / f"{name}.bin")
        out.update(_image_and_flip(embedder, decode_images(bins, size), name))
        out[f"{name}_issame"] = issame
    if (folder / "IJB").is_dir():
        meta = IJBMeta.read(folder / "IJB", info.get("ijb_name", "ijbc"))
        out.update(_image_and_flip(embedder, read_ijb_images(folder / "IJB", meta, size), "ijb"))
    return out
