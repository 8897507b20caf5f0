"""``f_correction``: forward loss correction (Patrini et al., CVPR 2017) on cross-entropy, retrieval on the
penultimate features (SGPS Sec. IV-B).

- Forward correction (the paper's Theorem 2): with T_ij = p(ỹ = j | y = i) the noise's transition matrix and
  h(x) the network's softmax, train on ℓ(Tᵀ h(x), ỹ) = −log (Tᵀ h(x))_ỹ: the loss of the *noisy* label under the
  clean prediction pushed through the noise; its minimiser is the clean-label one.
- T is estimated from a network trained on the noisy labels (Sec. 3.2, after Menon et al. 2015): for each class i
  the training sample most confidently of class i, x̄^i = argmax_x p̂(ỹ = i | x), gives row i, T̂_ij = p̂(ỹ = j | x̄^i).
  The authors' code can drop the top 3% first (the sample with the largest p̂ below the 97th percentile) against
  outliers: ``anchor_quantile`` (1.0: the paper's argmax; 0.97: the code's filter).

Ours, labelled in the schema: the estimating network is this run's own model after ``estimate_after_epochs`` epochs
of plain cross-entropy, and training then continues from it with the corrected loss (the paper re-trains a network
from scratch; continuing keeps one run's epoch budget and schedule). The estimate uses the eval-mode predictions of
every training row. F-correction assumes noise that depends on the class only (closed-set): the papers run it under
symmetric noise only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from noisydml.methods.base import Batch, EpochContext, MethodSetup, MethodSpec
from noisydml.methods.parts.classification import CLASSIFIER_FIELDS, ClassificationMethod
from noisydml.schema import Field, ParamsError


def estimate_transition(probabilities: torch.Tensor, quantile: float = 1.0) -> torch.Tensor:
    """T̂ (C x C) from the softmax outputs (N x C) of a network trained on noisy labels: row i is the output at the
    anchor of class i, the sample with the largest p̂(ỹ = i | x) (below the ``quantile`` of column i when < 1)."""
    num_classes = probabilities.shape[1]
    transition = torch.empty(num_classes, num_classes, dtype=probabilities.dtype)
    for i in range(num_classes):
        column = probabilities[:, i]
        if quantile < 1.0:
            threshold = torch.quantile(column, quantile)
            column = torch.where(column >= threshold, torch.zeros_like(column), column)
        transition[i] = probabilities[int(torch.argmax(column))]
    return transition


def forward_corrected_loss(logits: torch.Tensor, labels: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """Mean of −log (T̂ᵀ softmax(logits))_ỹ (Theorem 2's forward correction)."""
    noisy = F.softmax(logits, dim=1) @ transition
    return F.nll_loss(torch.log(noisy.clamp_min(1e-12)), labels)


class FCorrection(ClassificationMethod):
    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        c = setup.num_classes
        self.register_buffer("transition", torch.eye(c))
        self.register_buffer("estimated", torch.zeros((), dtype=torch.bool))

    def on_train_start(self, ctx: EpochContext, restored: bool) -> None:
        if self.hparams["estimate_after_epochs"] >= ctx.num_epochs:
            raise ParamsError(f"methods.f_correction.estimate_after_epochs: {self.hparams['estimate_after_epochs']} "
                              f"leaves no epoch for the corrected loss in train.epochs {ctx.num_epochs}; allowed: "
                              f"1..{ctx.num_epochs - 1}")

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        if bool(self.estimated) or ctx.epoch < self.hparams["estimate_after_epochs"]:
            return {}
        _, features = ctx.embed_train(features=True)
        self.transition.copy_(estimate_transition(self.predictions(features), self.hparams["anchor_quantile"]))
        self.estimated.fill_(True)
        return {"fcorrection_transition_diagonal": float(self.transition.diagonal().mean())}

    def loss(self, batch: Batch):
        if not bool(self.estimated):
            return super().loss(batch)  # plain cross-entropy until T is estimated
        return forward_corrected_loss(self.classifier(batch.features), batch.labels, self.transition), {}


SPEC = MethodSpec(
    build=FCorrection,
    schema={**CLASSIFIER_FIELDS,
            "estimate_after_epochs": Field(int, 6, min=1,
                                           help="ours: epochs of plain cross-entropy before T̂ is estimated from "
                                                "this run's model (the paper trains a separate network)"),
            "anchor_quantile": Field(float, 1.0, min=0.5, max=1.0,
                                     help="1.0: the paper's argmax anchor per class; 0.97: the authors' code's "
                                          "outlier filter")},
    description="F-correction (Patrini et al. 2017): forward loss correction with an estimated transition matrix",
)
