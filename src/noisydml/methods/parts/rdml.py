"""RDML: robust metric learning with the rescaled hinge loss (Al-Obaidi, Zabihzadeh, Hajiabadi; IJMLC 2020).

The rescaled hinge loss (Xu, Cao, Hu, Principe 2017, which RDML takes into metric learning) bounds the hinge
``h >= 0`` of a constraint:

    l_eta(h) = beta (1 - exp(-eta h)),   beta = 1 / (1 - exp(-eta))

so ``l_eta(1) = 1``, ``l_eta -> h`` as eta -> 0 and ``l_eta <= beta`` for any h: a pair that violates its
constraint by a lot (a wrong label) costs at most beta and its gradient ``eta beta exp(-eta h)`` fades, where
the hinge's stays constant. eta is the robustness knob; BSPML selects it from {0.5, 1, 2, 3, 4}.

RDML learns a Mahalanobis metric from pair constraints by half-quadratic optimisation. BSPML's table runs it as a
deep metric-learning loss; no implementation was published, so the constraints are **ours**: the contrastive
loss's pair hinges on cosine similarity, ``h = [m_pos - s]_+`` for positive pairs and ``[s - m_neg]_+`` for
negative ones, with BSPML's contrastive margins (m_pos = 1, m_neg = 0), so RDML differs from the contrastive
column of the same table by the rescaling alone. The half-quadratic solver is replaced by SGD on the same
objective (its fixed point); the reduction is pytorch-metric-learning's contrastive one (the mean of the non-zero
pair losses per side), as for the contrastive column.
"""

from __future__ import annotations

import math

import torch
from pytorch_metric_learning import distances, losses


def rescaled_hinge(hinge: torch.Tensor, eta: float) -> torch.Tensor:
    """``beta (1 - exp(-eta h))`` with ``beta = 1 / (1 - exp(-eta))`` (Xu et al. 2017; RDML)."""
    return (1.0 - torch.exp(-eta * hinge)) / -math.expm1(-eta)


class RescaledHingeContrastiveLoss(losses.ContrastiveLoss):
    """pytorch-metric-learning's contrastive loss with each pair's hinge rescaled (module docstring)."""

    def __init__(self, eta: float = 1.0, pos_margin: float = 1.0, neg_margin: float = 0.0, **kwargs):
        if eta <= 0:
            raise ValueError(f"eta: {eta}; allowed: > 0")
        kwargs.setdefault("distance", distances.CosineSimilarity())
        super().__init__(pos_margin=pos_margin, neg_margin=neg_margin, **kwargs)
        self.eta = eta

    def pos_calc(self, pos_pair_dist, margin):
        return rescaled_hinge(super().pos_calc(pos_pair_dist, margin), self.eta)

    def neg_calc(self, neg_pair_dist, margin):
        return rescaled_hinge(super().neg_calc(neg_pair_dist, margin), self.eta)
