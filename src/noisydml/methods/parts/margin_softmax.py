"""Margin-softmax logits as the face-recognition codes compute them (read, never copied): the target class's cosine
moved by a margin, every logit scaled by ``s``.

- ``cosface`` (Wang et al. 2018, Eq. 4): ``s (cos theta_y - m)``, the others ``s cos theta_j``.
- ``arcface`` (Deng et al. 2019, Eq. 3): ``s cos(theta_y + m)``, ``m`` in radians. Two gradients exist in the
  codes: pytorch-metric-learning differentiates through ``acos`` (and keeps the logit monotonic past
  ``theta_y = pi - m``); insightface's current arcface_torch (``CombinedMarginLoss`` with ``m1 = 1, m3 = 0``) and
  partial_fc compute ``cos(acos(c) + m)`` in place under ``no_grad``, so the forward value is the margin's and the
  gradient is that of ``s cos theta_y`` (straight through), with no threshold. :class:`StraightThroughArcFaceLoss`
  is pml's ``ArcFaceLoss`` with that gradient (``methods.arcface.loss.formulation: arcface_torch``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses

MARGIN_LOSSES = ("cosface", "arcface")

#: ArcFace's margin, 0.5 rad (ArcFace Sec. 3; arcface_torch's ``margin_list = (1.0, 0.5, 0.0)``), in the degrees
#: pytorch-metric-learning takes: 28.6479 (not the 28.6 of pml's default, 0.49916 rad).
ARCFACE_MARGIN_DEGREES = math.degrees(0.5)


def arcface_straight_through(cosine_of_target: torch.Tensor, margin: float) -> torch.Tensor:
    """``cos(acos(c) + m)`` in value, ``c`` in gradient (arcface_torch; no threshold past ``pi - m``)."""
    with torch.no_grad():
        moved = torch.cos(torch.acos(cosine_of_target.clamp(-1.0, 1.0)) + margin)
    return cosine_of_target + (moved - cosine_of_target.detach())  # value: moved; d/dc: 1


def margin_logits(cosine: torch.Tensor, labels: torch.Tensor, kind: str, margin: float, scale: float) -> torch.Tensor:
    """``(B, C)`` logits of ``cosine`` ``(B, C)`` with the target class ``labels`` moved by the margin: CosFace's
    subtraction, or ArcFace's angle added straight through (arcface_torch / partial_fc, which SKH's code uses)."""
    rows = torch.arange(len(labels), device=cosine.device)
    target = cosine[rows, labels]
    if kind == "cosface":
        moved = target - margin
    elif kind == "arcface":
        moved = arcface_straight_through(target, margin)
    else:
        raise ValueError(f"margin loss {kind!r}; allowed: {', '.join(MARGIN_LOSSES)}")
    onehot = F.one_hot(labels, cosine.shape[1]).to(cosine.dtype)
    return scale * (cosine + onehot * (moved - target).unsqueeze(1))


class StraightThroughArcFaceLoss(losses.ArcFaceLoss):
    """pytorch-metric-learning's ``ArcFaceLoss`` (its weights, reducer and degrees) with arcface_torch's target
    logit: ``cos(theta_y + m)`` without pml's threshold, its gradient that of ``cos theta_y``."""

    def modify_cosine_of_target_classes(self, cosine_of_target_classes):
        return arcface_straight_through(cosine_of_target_classes, float(self.margin))


ARCFACE_FORMULATIONS = ("pml", "arcface_torch")


def arcface_loss(num_classes: int, embedding_size: int, margin: float, scale: float, formulation: str = "pml"):
    """ArcFace by ``formulation``: ``pml`` (gradient through the angle, monotonic past ``pi - m``) or
    ``arcface_torch`` (straight-through gradient, no threshold)."""
    if formulation not in ARCFACE_FORMULATIONS:
        raise ValueError(f"formulation {formulation!r}; allowed: {', '.join(ARCFACE_FORMULATIONS)}")
    cls = losses.ArcFaceLoss if formulation == "pml" else StraightThroughArcFaceLoss
    return cls(num_classes=num_classes, embedding_size=embedding_size, margin=margin, scale=scale)
