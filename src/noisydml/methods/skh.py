"""``skh``: Switchable K-class Hyperplanes (Liu, Song, Chen, Qiao, Zhang; ICCV 2021), SGPS Table IV's best
classifier on MS1MV0 (IJB-C TAR@1e-5 93.00).

K complete classifiers ("hyperplanes") over the identities; each sample is trained by the one that fits it best:

    L = 1/B sum_i min_k CE( margin_logits(cos(x_i, W_k)), y_i )

where ``W_k`` is head ``k``'s ``classes x d`` weight matrix and ``margin_logits`` CosFace's or ArcFace's margin
softmax (:mod:`noisydml.methods.parts.margin_softmax`). An identity split across two labels (an inter-class
conflict) can sit on different heads instead of being pulled apart in one. This is the equation of the authors'
``skh.py`` (liubx07/SKH, ``NaiveFCSKH``; read, never copied): one ``(classes * K) x d`` weight drawn from
N(0, 0.01), rows ``k * classes + j`` head ``k``'s class ``j``, cosines clamped to [-1, 1], each head's
cross-entropy per sample, their minimum, the batch mean; ArcFace's margin as partial_fc computes it (straight-through
gradient). Its defaults are the code's: K = 3, CosFace, s 50, m 0.3.

What is ours: the weights' learning rate (``lr_multiplier``, as every classifier's here) and their weight decay.
What retrieval and verification compare is the embedding the heads classify (as ArcFace's).

Exposed (never shown ground truth): per epoch, the share of samples each head won (``skh_head_<k>_share``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from noisydml.methods.base import Batch, Method, MethodSetup, MethodSpec
from noisydml.methods.parts.margin_softmax import MARGIN_LOSSES, margin_logits
from noisydml.methods.parts.pml import PROXY_WEIGHT_DECAY_FIELD
from noisydml.schema import Field

SCHEMA = {
    "heads": Field(int, 3, min=1, help="K switchable classifiers per identity (skh.py: skh_k = 3)"),
    "margin_loss": Field(str, "cosface", choices=MARGIN_LOSSES,
                         help="each head's margin softmax (skh.py: cosface; or arcface, partial_fc's)"),
    "scale": Field(float, 50.0, min=1e-6, help="s (skh.py: 50)"),
    "margin": Field(float, 0.3, min=0.0, help="m: cosine units for cosface, radians for arcface (skh.py: 0.3)"),
    "lr_multiplier": Field(float, 100.0, min=0.0,
                           help="ours: the heads' learning rate / train's (100, as the other classifiers')"),
    "proxy_weight_decay_factor": PROXY_WEIGHT_DECAY_FIELD,
}


def skh_losses(embeddings: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, heads: int, kind: str,
               margin: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-sample loss, winning head)``: each of the ``heads`` classifiers' margin-softmax cross-entropy, the
    minimum over them (``weight``: ``(heads * classes, d)``, head ``k``'s class ``j`` at row ``k * classes + j``)."""
    classes = weight.shape[0] // heads
    cosine = F.linear(F.normalize(embeddings, dim=1), F.normalize(weight, dim=1)).clamp(-1.0, 1.0)
    per_head = cosine.reshape(len(embeddings), heads, classes)
    losses = torch.stack([F.cross_entropy(margin_logits(per_head[:, k], labels, kind, margin, scale), labels,
                                          reduction="none") for k in range(heads)], dim=1)
    best = losses.min(dim=1)
    return best.values, best.indices


class SKH(Method):
    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        heads = self.hparams["heads"]
        self.weight = nn.Parameter(torch.normal(0.0, 0.01, (setup.num_classes * heads, setup.embedding_dim)))
        self.register_buffer("wins", torch.zeros(heads, dtype=torch.float64))

    def loss(self, batch: Batch):
        hp = self.hparams
        per_sample, head = skh_losses(batch.embeddings, batch.labels, self.weight.to(batch.embeddings.device),
                                      hp["heads"], hp["margin_loss"], hp["margin"], hp["scale"])
        with torch.no_grad():
            self.wins += torch.bincount(head.cpu(), minlength=hp["heads"]).to(self.wins)
        return per_sample.mean(), {}

    def on_epoch_start(self, ctx) -> dict[str, float]:
        self.wins.zero_()
        return {}

    def on_epoch_end(self, ctx) -> dict[str, float]:
        total = float(self.wins.sum()) or 1.0
        return {f"skh_head_{k}_share": float(v) / total for k, v in enumerate(self.wins.tolist())}


SPEC = MethodSpec(build=SKH, schema=SCHEMA,
                  description="SKH (Liu et al. 2021): K switchable classifiers, each sample trained by its best one")
