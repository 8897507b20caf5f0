"""The contextual loss: metric learning to rank via contextual similarity (Liao, Tsiligkaridis, Kulis; ICML 2023).

On a batch of L2-normalised embeddings, ``S = Z Z^T`` and ``D = 2 - 2 S`` (squared distances), the paper's
contextual similarity (Sec. 3) is built in four steps:

1. **Neighbourhoods.** ``N_k(i)``: the rows within ``epsilon`` of ``i``'s k-th nearest (``i`` itself is its own
   nearest), as a 0/1 mask ``A_ij = H(-D_ij + epsilon - (-D_i,(k)))``. H is the Heaviside step; its gradient is
   replaced by a constant ``g`` towards ``D_ij`` (and ``-g`` towards the detached threshold) -- the authors'
   straight-through surrogate.
2. **Contextual similarity.** ``W~_ij = 1/2 (|N_k(i) n N_k(j)| / |N_k(i)| + |~N_k(i) n ~N_k(j)| / |~N_k(i)|) A_ij``:
   shared neighbours and shared non-neighbours, counted only for j in i's neighbourhood; the denominators are
   detached (the authors' code).
3. **Query expansion.** ``W_i = mean_{j in R_{k/2}(i)} W~_j`` over the reciprocal k/2-neighbours
   ``R_{k/2}(i) = {j : j in N_{k/2}(i), i in N_{k/2}(j)}`` (i itself always among them).
4. **Symmetry.** ``W = (W + W^T) / 2``.

Loss (Sec. 3, "hybrid"): ``L = lambda L_context + gamma L_reg + (1 - lambda - gamma) L_contrast`` with

- ``L_context = 1/B^2 sum_{i != j} [y_ij (1 - W_ij)^2 + (1 - y_ij) W_ij^2]`` (y_ij: same label),
- ``L_reg = (mean_ij S_ij - s_reg)^2``, the similarity regulariser (mean over the whole matrix),
- ``L_contrast``: the contrastive loss on cosine similarity with positive margin 0.75 and negative margin 0.6,
  each side the mean of its non-zero pair losses (pytorch-metric-learning's ``ContrastiveLoss``).

k = 4, epsilon = 0.05, lambda = 0.4, gamma = 0.1, s_reg = 0.25, g = 10: the authors' code defaults
(Chris210634/metric-learning-using-contextual-similarity, the CUB/Cars runs); the paper tunes lambda and gamma
per dataset. **Ours:** a batch smaller than k + 1 (PRISM/SGPS keep a subset) uses k = batch size - 1; the
neighbourhood threshold is the k-th value of ``-D`` taken with ties as torch.topk breaks them. Within our P x K
sampler (the authors' is P x 4 too, batch 128) nothing else differs: the loss needs only the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning import distances, losses

from noisydml.methods.parts.pml import PMLBaseline
from noisydml.schema import Field


class StraightThroughStep(torch.autograd.Function):
    """``H(x - y)`` forward (H(0) = 1); backward a constant ``g`` to x and ``-g`` to y (the authors' surrogate)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor, g: float) -> torch.Tensor:
        ctx.g = g
        return (x >= y).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_y = -grad_output * ctx.g
        return grad_output * ctx.g, grad_y.sum(dim=1, keepdim=True), None


def neighbourhood(minus_distance: torch.Tensor, k: int, epsilon: float, g: float) -> torch.Tensor:
    """Step 1: the 0/1 mask of the rows within epsilon of each row's k-th nearest (itself included)."""
    kth = minus_distance.topk(k, dim=1).values[:, k - 1:k].detach()
    return StraightThroughStep.apply(minus_distance + epsilon, kth, g)


def contextual_similarity(similarity: torch.Tensor, k: int, epsilon: float, g: float) -> torch.Tensor:
    """Steps 1-4 of the module docstring: ``W`` of a batch's cosine similarities ``(B, B)``."""
    minus_distance = -(2.0 - 2.0 * similarity).clamp(min=0.0)
    near = neighbourhood(minus_distance, k, epsilon, g)
    far = 1.0 - near
    shared_near = (near @ near.T) / near.sum(dim=1, keepdim=True).detach()
    shared_far = (far @ far.T) / far.sum(dim=1, keepdim=True).detach().clamp(min=1.0)
    w_tilde = 0.5 * (shared_near + shared_far) * near
    half = neighbourhood(minus_distance, max(k // 2, 1), epsilon, g)
    reciprocal = half * half.T
    expanded = (reciprocal @ w_tilde) / reciprocal.sum(dim=1, keepdim=True)
    return 0.5 * (expanded + expanded.T)


class ContextualLoss(torch.nn.Module):
    """``lambda L_context + gamma L_reg + (1 - lambda - gamma) L_contrast`` (module docstring)."""

    def __init__(self, k: int = 4, epsilon: float = 0.05, context_weight: float = 0.4, reg_weight: float = 0.1,
                 reg_similarity: float = 0.25, pos_margin: float = 0.75, neg_margin: float = 0.6,
                 step_gradient: float = 10.0):
        super().__init__()
        self.k, self.epsilon, self.step_gradient = k, epsilon, step_gradient
        self.context_weight, self.reg_weight, self.reg_similarity = context_weight, reg_weight, reg_similarity
        self.contrast = losses.ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin,
                                               distance=distances.CosineSimilarity())

    def terms(self, embeddings: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        z = F.normalize(embeddings, dim=1)
        similarity = z @ z.T
        b = len(z)
        same = (labels[:, None] == labels[None, :]).to(z.dtype)
        off_diagonal = 1.0 - torch.eye(b, dtype=z.dtype, device=z.device)
        if b > 1:
            w = contextual_similarity(similarity, min(self.k, b - 1), self.epsilon, self.step_gradient)
            context = (((1.0 - w).square() * same + w.square() * (1.0 - same)) * off_diagonal).sum() / b ** 2
        else:
            context = similarity.sum() * 0.0
        return {"context": context, "reg": (similarity.mean() - self.reg_similarity).square(),
                "contrast": self.contrast(embeddings, labels)}

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t = self.terms(embeddings, labels)
        return (self.context_weight * t["context"] + self.reg_weight * t["reg"]
                + (1.0 - self.context_weight - self.reg_weight) * t["contrast"])


#: contextual as a pytorch-metric-learning-style baseline (the loss alone: ``contextual``; SGPS around it: ``sgps_contextual``).
CONTEXTUAL = PMLBaseline(
    ContextualLoss, {"k": 4, "epsilon": 0.05, "context_weight": 0.4, "reg_weight": 0.1, "reg_similarity": 0.25,
                     "pos_margin": 0.75, "neg_margin": 0.6, "step_gradient": 10.0},
    "contextual similarity loss + contrastive + similarity regulariser (Liao et al. 2023)",
    loss_fields={
        "k": Field(int, 4, min=1, help="neighbourhood size (authors' code: 4)"),
        "epsilon": Field(float, 0.05, min=0.0, help="neighbourhood slack on squared distance (authors' code: 0.05)"),
        "context_weight": Field(float, 0.4, min=0.0, max=1.0, help="lambda (authors' code: 0.4)"),
        "reg_weight": Field(float, 0.1, min=0.0, max=1.0, help="gamma (authors' code: 0.1)"),
        "reg_similarity": Field(float, 0.25, help="target mean similarity of L_reg (authors' code: 0.25)"),
        "pos_margin": Field(float, 0.75, help="contrastive positive margin (authors' code: 0.75)"),
        "neg_margin": Field(float, 0.6, help="contrastive negative margin (authors' code: 0.6)"),
        "step_gradient": Field(float, 10.0, min=0.0,
                               help="the Heaviside's surrogate gradient (authors' code: 10)"),
    },
)
