"""``subcenter_arcface``: Sub-center ArcFace (Deng, Guo, Liu, Gong, Zafeiriou; ECCV 2020), pytorch-metric-learning's
``SubCenterArcFaceLoss`` and its drop rule.

K sub-centres per identity; a sample's cosine to its class is the largest over the class's sub-centres, then
ArcFace's margin. Noisy samples gather on non-dominant sub-centres. The paper's cleaning (insightface
``recognition/subcenter_arcface``, ``drop.py``): per identity, the *dominant* sub-centre is the one most of its
samples are nearest to; samples further than ``drop_angle`` (75 degrees) from it are dropped, and the
non-dominant sub-centres are discarded. pml's ``get_outliers`` applies that rule.

What is ours: the drop happens inside the run, at the start of epoch ``drop_epoch``, on every training row's
embedding then; the remaining epochs train ArcFace with one centre per identity (the dominant ones) on the kept
rows, from the current weights; an identity none of whose rows is kept leaves the softmax (its centre is no
negative), as ``drop.py`` writes no such identity. The paper retrains a new model from scratch on the cleaned list; that is a chain of
two runs (this one's ``keep`` export as the next run's keep column). ``drop_epoch: -1``: never drop (Sub-center
ArcFace without cleaning, K centres to the end).

Exposed for judging (never shown ground truth): ``keep`` after the drop; exported as ``keep`` (1 = kept).
"""

from __future__ import annotations

import numpy as np
import torch
from pytorch_metric_learning import losses

from noisydml.methods.base import Batch, Decisions, EpochContext, Method, MethodSetup, MethodSpec
from noisydml.methods.parts.margin_softmax import ARCFACE_MARGIN_DEGREES
from noisydml.methods.parts.pml import PROXY_WEIGHT_DECAY_FIELD
from noisydml.schema import Field, ParamsError

SCHEMA = {
    "margin": Field(float, ARCFACE_MARGIN_DEGREES, min=0.0,
                    help="ArcFace's additive angle, in degrees (28.64788975654116 = 0.5 rad, the paper's)"),
    "scale": Field(float, 64.0, min=1e-6, help="s"),
    "sub_centers": Field(int, 3, min=1, help="K sub-centres per identity (the paper: 3)"),
    "drop_angle": Field(float, 75.0, min=0.0, max=180.0,
                        help="samples further than this (degrees) from their identity's dominant sub-centre are "
                             "dropped (the paper: 75)"),
    "drop_epoch": Field(int, -1, min=-1,
                        help="ours: the epoch (0-based) at whose start the drop happens inside the run; -1 = never"),
    "lr_multiplier": Field(float, 100.0, min=0.0,
                           help="ours: the sub-centres' learning rate / train's (100, as the other proxies')"),
    "proxy_weight_decay_factor": PROXY_WEIGHT_DECAY_FIELD,
}


def dominant_drop(loss: losses.SubCenterArcFaceLoss, embeddings: torch.Tensor, labels: torch.Tensor,
                  drop_angle: float) -> tuple[np.ndarray, torch.Tensor]:
    """The drop rule: ``(keep, dominant)``, ``keep`` a bool per row (False: further than ``drop_angle`` from its
    identity's dominant sub-centre), ``dominant`` the ``(d, classes)`` dominant centres (pml's ``get_outliers``)."""
    outliers, dominant = loss.get_outliers(embeddings, labels, threshold=drop_angle, return_dominant_centers=True)
    keep = np.ones(len(labels), dtype=bool)
    keep[outliers.cpu().numpy().astype(np.int64)] = False
    return keep, dominant


class ArcFaceOverLiveIdentities(losses.ArcFaceLoss):
    """pml's ArcFace whose softmax runs over the identities with a kept row only (``alive``): insightface's
    ``drop.py`` writes no identity whose images were all dropped, so its centre is no negative after the drop."""

    def __init__(self, num_classes: int, **kwargs):
        super().__init__(num_classes=num_classes, **kwargs)
        self.register_buffer("alive", torch.ones(num_classes, dtype=torch.bool))

    def scale_logits(self, logits, *_):
        return (logits * self.scale).masked_fill(~self.alive.to(logits.device), float("-inf"))


class SubCenterArcFace(Method):
    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        hp = self.hparams
        self.subcenter = losses.SubCenterArcFaceLoss(num_classes=setup.num_classes, embedding_size=setup.embedding_dim,
                                                     margin=hp["margin"], scale=hp["scale"],
                                                     sub_centers=hp["sub_centers"])
        #: after the drop: ArcFace with the dominant centres (set at the drop; unused before)
        self.arcface = ArcFaceOverLiveIdentities(num_classes=setup.num_classes, embedding_size=setup.embedding_dim,
                                                 margin=hp["margin"], scale=hp["scale"])
        self.register_buffer("dropped", torch.zeros((), dtype=torch.bool))
        self.register_buffer("keep", torch.ones(setup.dataset_size, dtype=torch.bool))

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        if ctx.epoch != self.hparams["drop_epoch"] or bool(self.dropped):
            return {}
        embeddings = ctx.embed_train().float().to(self.subcenter.W.device)
        labels = torch.as_tensor(self.setup.train_labels, device=embeddings.device)
        keep, dominant = dominant_drop(self.subcenter, embeddings, labels, self.hparams["drop_angle"])
        alive = np.bincount(np.asarray(self.setup.train_labels)[keep], minlength=self.setup.num_classes) > 0
        with torch.no_grad():
            self.arcface.W.copy_(dominant)
            self.arcface.alive.copy_(torch.from_numpy(alive))
        self.keep.copy_(torch.from_numpy(keep))
        self.dropped.fill_(True)
        print(f"sub-center drop at epoch {ctx.epoch}: {int((~keep).sum())} of {len(keep)} rows dropped, "
              f"{int((~alive).sum())} of {len(alive)} identities left without a row (removed from the softmax)")
        return {"subcenter_dropped_fraction": float((~keep).mean()),
                "subcenter_removed_identities_fraction": float((~alive).mean())}

    def loss(self, batch: Batch):
        if not bool(self.dropped):
            return self.subcenter(batch.embeddings, batch.labels), {}
        kept = self.keep[batch.index.to(self.keep.device)].to(batch.embeddings.device)
        if not kept.any():
            return batch.embeddings.sum() * 0.0, {"kept_fraction": 0.0}
        return self.arcface(batch.embeddings[kept], batch.labels[kept]), {"kept_fraction": float(kept.float().mean())}

    def decisions(self) -> Decisions | None:
        return Decisions(keep=self.keep.cpu().numpy().astype(float)) if bool(self.dropped) else None

    def export(self, ctx: EpochContext) -> dict[str, np.ndarray]:
        return {"keep": self.keep.cpu().numpy().astype(np.int64)}


def _validate(hp: dict, where: str) -> None:
    if hp["drop_epoch"] >= 0 and hp["sub_centers"] < 2:
        raise ParamsError(f"{where}.sub_centers: {hp['sub_centers']} has no non-dominant centre to drop; allowed: "
                          f">= 2 with drop_epoch {hp['drop_epoch']}, or drop_epoch: -1")


SPEC = MethodSpec(build=SubCenterArcFace, schema=SCHEMA, validate=_validate, exports=("keep",),
                  description="Sub-center ArcFace (Deng et al. 2020): K sub-centres per identity, the dominant kept, "
                              "far samples dropped")
