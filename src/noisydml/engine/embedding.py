"""Embedding passes: a model's embeddings (and backbone features) of a set of images, in eval mode."""

from __future__ import annotations

import torch

from noisydml.data.images import InputPipeline


@torch.no_grad()
def embed(model: torch.nn.Module, images, device: torch.device, batch_size: int = 512,
          features: bool = False, pipeline: InputPipeline | None = None):
    """Embeddings (and with ``features`` the backbone features) of ``images``, eval mode, on the CPU.

    ``images``: uint8 arrays, :class:`~noisydml.data.images.ImageFiles` (decoded and eval-transformed by
    ``pipeline``) or a float tensor of network inputs."""
    pipeline = pipeline or InputPipeline()
    # each module's own mode comes back (a frozen batch-norm stays in eval mode inside a training epoch)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    embs, feats = [], []
    for x in pipeline.eval_batches(images, batch_size):
        e, f = model.forward_with_features(x.to(device, non_blocking=True))
        embs.append(e.cpu())
        feats.append(f.cpu())
    for module, mode in modes:
        module.training = mode
    emb = torch.cat(embs) if embs else torch.empty(0)
    if not features:
        return emb
    return emb, (torch.cat(feats) if feats else torch.empty(0))
