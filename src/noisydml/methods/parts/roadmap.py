"""ROADMAP: robust and decomposable average precision (Ramzi, Thome, Rambour, Audebert, Bitot; NeurIPS 2021).

Average precision of query ``i`` over its retrieval set ``Omega_i`` (the batch without ``i``), positives ``P_i``,
negatives ``N_i``, similarities ``s_j = <z_i, z_j>`` (Sec. 3):

    AP_i = (1/|P_i|) sum_{k in P_i} rank+(k) / rank(k),
    rank+(k) = 1 + sum_{j in P_i, j != k} H(s_j - s_k),   rank(k) = rank+(k) + rank-(k),
    rank-(k) = sum_{j in N_i} H(s_j - s_k)                 (H: the Heaviside step).

**SupAP** (Sec. 3.1): rank+ keeps the exact H (the positives' mutual order carries no gradient; the paper shows
the AP gradient needs only rank-), rank- replaces H by its smooth *upper bound* ``H^-``:

    H^-(t) = sigma(t / tau)                              t <= 0   (a negative below the positive: -> 0)
             1/2 + sigma(t / tau)                        0 < t <= delta
             1/2 + sigma(delta / tau) + rho (t - delta)  t > delta (a linear penalty: the gradient never vanishes)

so ``H^- >= H`` everywhere and ``1 - SupAP >= 1 - AP``: the loss is an upper bound of the AP loss. tau = 0.01,
rho = 100, delta = 0.05 are the authors' code defaults (elias-ramzi/ROADMAP). **Ours:** the last piece is
continuous at delta; the authors' code writes ``rho t + 1.44`` there (a jump from 1.49 to 6.44). The paper's
exact piecewise form was not available offline: this is our reading of its text (an upper bound, sigmoid below
zero, linear above) with the code's delta.

``rank_approximation: sigmoid`` gives Smooth-AP's approximation instead (Brown et al. 2020: ``sigma(t/tau)`` for
every negative), the approximation ROADMAP compares against; as tau -> 0 it tends to the exact AP (tested).

**Calibration loss** (Sec. 3.2, the decomposability gap): ``L_calibr = mean_{pos pairs} [alpha - s]_+ +
mean_{neg pairs} [s - beta]_+`` with alpha = 0.9, beta = 0.6 (the authors' config): pytorch-metric-learning's
``ContrastiveLoss`` on cosine similarity, whose mean over the non-zero pair losses per side is the authors'
reduction. Total: ``L_ROADMAP = (1 - lambda) (1 - mean_i SupAP_i) + lambda L_calibr``; lambda = 0.5 (the
authors' config weights the two terms equally).

**Ours, within our P x K sampler:** AP is computed over the batch only (each row a query, the others its
retrieval set); the paper's large batches (and the cross-batch memory its code offers for SOP) are not
reproduced. A query without a positive in the batch (PRISM/SGPS keep a subset) is left out of the mean.
Cost: ``B x B x B`` per step (every query ranks every pair), 262k entries at B = 64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pytorch_metric_learning import distances, losses

from noisydml.methods.parts.pml import PMLBaseline
from noisydml.schema import Field

RANK_APPROXIMATIONS = ("suprank", "sigmoid")


def smooth_upper_heaviside(t: torch.Tensor, tau: float, rho: float, delta: float) -> torch.Tensor:
    """``H^-`` of SupAP (module docstring): an upper bound of the Heaviside step, sigmoid below 0, linear past delta."""
    above = 0.5 + torch.sigmoid(t / tau)
    linear = 0.5 + 1.0 / (1.0 + math.exp(-delta / tau)) + rho * (t - delta)
    return torch.where(t <= 0, torch.sigmoid(t / tau), torch.where(t <= delta, above, linear))


def average_precision(similarity: torch.Tensor, same: torch.Tensor, negative_step) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query ``i`` (a row), the AP of ranking the other columns by ``similarity`` (``(Q, M)``, column i is the
    query itself and is left out; ``same[i, j]``: j has i's label).

    ``negative_step(t)`` counts a negative ranked ``t`` above a positive (H for the exact AP, ``H^-`` for SupAP);
    the positives among themselves always count with the exact H. Returns (AP per query, whether it has a
    positive). ``(Q, M, M)`` work: ``t[i, k, j] = s_ij - s_ik`` for positive k of query i and every j."""
    q, m = similarity.shape
    others = ~torch.eye(q, m, dtype=torch.bool, device=similarity.device)
    positive = same & others
    negative = ~same & others
    t = similarity[:, None, :] - similarity[:, :, None]  # [i, k, j]: s_ij - s_ik
    exact = (t.detach() >= 0).to(similarity.dtype)       # H with H(0) = 1 (a tie ranks the other first)
    not_k = ~torch.eye(m, dtype=torch.bool, device=similarity.device)[None]
    rank_plus = 1.0 + (exact * (positive[:, None, :] & not_k)).sum(dim=2)
    rank_minus = (negative_step(t) * negative[:, None, :]).sum(dim=2)
    precision = rank_plus / (rank_plus + rank_minus)     # [i, k]
    count = positive.sum(dim=1)
    ap = (precision * positive).sum(dim=1) / count.clamp(min=1)
    return ap, count > 0


class RoadmapLoss(torch.nn.Module):
    """``(1 - lambda) (1 - SupAP) + lambda L_calibr`` on a batch (see the module docstring)."""

    def __init__(self, tau: float = 0.01, rho: float = 100.0, delta: float = 0.05, calibration_weight: float = 0.5,
                 pos_margin: float = 0.9, neg_margin: float = 0.6, rank_approximation: str = "suprank"):
        super().__init__()
        if rank_approximation not in RANK_APPROXIMATIONS:
            raise ValueError(f"rank_approximation: {rank_approximation!r}; allowed: {RANK_APPROXIMATIONS}")
        self.tau, self.rho, self.delta = tau, rho, delta
        self.calibration_weight = calibration_weight
        self.rank_approximation = rank_approximation
        self.calibration = losses.ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin,
                                                  distance=distances.CosineSimilarity())

    def negative_step(self, t: torch.Tensor) -> torch.Tensor:
        if self.rank_approximation == "sigmoid":
            return torch.sigmoid(t / self.tau)
        return smooth_upper_heaviside(t, self.tau, self.rho, self.delta)

    def supap(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean SupAP (or Smooth-AP) over the queries with a positive; 0 when none has one."""
        z = F.normalize(embeddings, dim=1)
        ap, has = average_precision(z @ z.T, labels[:, None] == labels[None, :], self.negative_step)
        return ap[has].mean() if has.any() else ap.sum() * 0.0

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ap_loss = 1.0 - self.supap(embeddings, labels)
        return (1.0 - self.calibration_weight) * ap_loss + self.calibration_weight * self.calibration(embeddings, labels)


#: roadmap as a pytorch-metric-learning-style baseline (the loss alone: ``roadmap``; SGPS around it: ``sgps_roadmap``).
ROADMAP = PMLBaseline(
    RoadmapLoss, {"tau": 0.01, "rho": 100.0, "delta": 0.05, "calibration_weight": 0.5, "pos_margin": 0.9,
                  "neg_margin": 0.6, "rank_approximation": "suprank"},
    "ROADMAP: SupAP (smooth-rank AP, an upper bound of the AP loss) + calibration loss (Ramzi et al. 2021)",
    loss_fields={
        "tau": Field(float, 0.01, min=1e-6, help="sigmoid temperature of H^- (authors' code: 0.01)"),
        "rho": Field(float, 100.0, min=0.0, help="slope of H^- past delta (authors' code: 100)"),
        "delta": Field(float, 0.05, min=0.0, help="where H^- turns linear (authors' code: 0.05)"),
        "calibration_weight": Field(float, 0.5, min=0.0, max=1.0,
                                    help="lambda: (1 - lambda) (1 - SupAP) + lambda L_calibr (authors' config: 0.5)"),
        "pos_margin": Field(float, 0.9, help="alpha of the calibration loss (authors' config: 0.9)"),
        "neg_margin": Field(float, 0.6, help="beta of the calibration loss (authors' config: 0.6)"),
        "rank_approximation": Field(str, "suprank", choices=RANK_APPROXIMATIONS,
                                    help="suprank (ROADMAP's H^-) or sigmoid (Smooth-AP's, for comparison)"),
    },
)
