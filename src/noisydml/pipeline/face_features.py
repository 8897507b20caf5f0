"""What a face run keeps for verification: its final model's features of a ``faces`` dataset's verification images.

The train stage calls this when the run's prepared dataset has verification sets (``verification/<set>.bin``,
``verification/IJB``). It only embeds: every image and its horizontal flip, raw (the network's output before its
L2 normalisation, as insightface's protocols take it), read through
the real readers (insightface ``.bin`` files; IJB meta files and crops, aligned), a block at a time. How the features are combined
and scored is the protocols' business, in the evaluate stage (:mod:`noisydml.pipeline.face_eval`), so a change of
protocol re-evaluates runs without retraining them.

What retrieval ranks with is what verification compares (:attr:`Method.retrieval`: the embeddings, or the backbone
features of a classifier).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

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


class Unnormalised(torch.nn.Module):
    """An embedding network's forward *before* its L2 normalisation: ``(head(backbone(x)), backbone(x))``.
    insightface's protocols take the network's raw output: the ``.bin`` sets sum an image's and its flip's raw
    features before normalising, IJB keeps their norms (``use_norm_score``); a unit vector per image would make
    both do nothing."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        if not (hasattr(net, "backbone") and hasattr(net, "head")):
            raise TypeError(f"{type(net).__name__}: verification needs a backbone -> head network (EmbeddingNet)")
        self.net = net

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.net.backbone(x)
        return self.net.head(features), features


def model_embedder(model, retrieval: str, train_cfg: dict, runtime: dict, seed: int):
    """``images (N, H, W, C) uint8 -> (N, d) float32``: ``model`` through the run's eval input pipeline, giving
    what the method's retrieval ranks with (``retrieval``: embeddings | features), *not* L2-normalised
    (:class:`Unnormalised`)."""
    from noisydml.data.images import InputPipeline
    from noisydml.engine.embedding import embed

    device = next(model.parameters()).device
    pipeline = InputPipeline.from_params(train_cfg, runtime, seed, device)
    in_channels = next(p for p in model.parameters() if p.ndim == 4).shape[1]
    features = retrieval == "features"
    raw = Unnormalised(model)

    def embedder(images: np.ndarray) -> np.ndarray:
        if images.shape[-1] != in_channels:  # a grey model sees the mean of the channels
            images = images.mean(-1, keepdims=True).round().astype(np.uint8)
        out = embed(raw, np.ascontiguousarray(images), device, features=features, pipeline=pipeline)
        return (out[1] if features else out).float().numpy()

    return embedder


#: Images decoded, embedded and flipped at a time (ours): 4,096 at 112 px are 154 MB, where IJB-C's 469,375 images
#: and their flips held at once were 2 x 17.7 GB. A multiple of the embedding pass's batch (512), so the network sees
#: the same batches as in one pass over the set.
BLOCK_IMAGES = 4096


def _image_and_flip(embedder, count: int, load, prefix: str, block: int = BLOCK_IMAGES) -> dict[str, np.ndarray]:
    """``<prefix>_image`` and ``<prefix>_flip``: the features of ``count`` images, read ``block`` at a time by
    ``load(rows)``; a block and its flip are the only images alive at once."""
    images, flips = [], []
    for start in range(0, count, block):
        pixels = load(np.arange(start, min(start + block, count)))
        images.append(embedder(pixels))
        flips.append(embedder(np.ascontiguousarray(pixels[:, :, ::-1])))
        del pixels
    empty = np.zeros((0, 0), np.float32)
    return {f"{prefix}_image": np.concatenate(images) if images else empty,
            f"{prefix}_flip": np.concatenate(flips) if flips else empty}


def verification_embeddings(embedder, prepared_dir: str | Path, block: int = BLOCK_IMAGES) -> dict[str, np.ndarray]:
    """Per ``.bin`` set its 2P images' and their flips' features (``<set>_image``, ``<set>_flip``) and pair flags
    (``<set>_issame``); for the IJB set every image's and flip's features in the meta file's order
    (``ijb_image``, ``ijb_flip``). Images are read at the prepared dataset's image size, ``block`` at a time
    (the features of a block do not depend on the others: the model is in eval mode)."""
    prepared_dir = Path(prepared_dir)
    folder = prepared_dir / "verification"
    info = io.read_json(prepared_dir / "info.json")
    size = int(info["image_shape"][0])
    out: dict[str, np.ndarray] = {}
    for name in verification_sets(prepared_dir):
        bins, issame = read_verification_bin(folder / f"{name}.bin")
        out.update(_image_and_flip(embedder, len(bins), lambda rows: decode_images([bins[i] for i in rows], size),
                                   name, block))
        out[f"{name}_issame"] = issame
    if (folder / "IJB").is_dir():
        meta = IJBMeta.read(folder / "IJB", info.get("ijb_name", "ijbc"))
        out.update(_image_and_flip(embedder, len(meta.images),
                                   lambda rows: read_ijb_images(folder / "IJB", meta, size, rows), "ijb", block))
    return out


def after_training(model, retrieval: str, params: dict, seed: int, prepared_dir: str | Path,
                   run_folder: str | Path) -> None:
    """The ``faces`` kind's step after training (:attr:`noisydml.data.registry.DatasetKind.after_training`): its
    verification images' features in the run folder (:data:`VERIFICATION_EMBEDDINGS`), which the evaluate stage
    scores; nothing where the prepared dataset has no verification set."""
    if not has_verification(prepared_dir):
        return
    embedder = model_embedder(model, retrieval, params["train"], params["runtime"], seed)
    np.savez(Path(run_folder) / VERIFICATION_EMBEDDINGS, **verification_embeddings(embedder, prepared_dir))
