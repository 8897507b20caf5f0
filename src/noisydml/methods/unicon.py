"""``unicon``: UNICON (Karim et al., CVPR 2022): uniform selection of clean samples by Jensen-Shannon divergence,
then MixMatch (as DivideMix) plus a contrastive term on the unlabelled samples; retrieval on the penultimate
features (SGPS Sec. IV-B).

The division (Sec. 3.1): the divergence d_i = JSD(p̄_i, e_{ỹ_i}) between the two networks' mean prediction and the
given label (Eq. 1); the selection ratio R = |{i : d_i < d̄'}| / N with d̄' the mean divergence, lowered to
d̄ − (d̄ − min d)/τ when the mean exceeds ``d_u`` (the authors' code: d_u 0.7, τ 5); then *uniform* selection:
from every class (by its given label) the R share of its samples with the lowest divergence is labelled, so each
class contributes the same share. w_i = 1 − d_i. Both networks train on the same division (it is made from both).

The contrastive term (Sec. 3.3): SimCLR's NT-Xent (pytorch-metric-learning's ``NTXentLoss``) between two augmented
views of each unlabelled row, on the embedding head's L2-normalised output (the projection head; it trains here),
weighted ``lambda_c`` (the authors' 0.025), on both networks. The step is :mod:`noisydml.methods.parts.codivide`'s.

Ours, labelled in the schema: the contrastive views are the MixMatch views' augmentation with other draws (the
authors use stronger augmentations for them), its temperature; the two networks share one division per epoch
(the authors recompute it between training net 1 and net 2).
"""

import torch
from pytorch_metric_learning.losses import NTXentLoss

from noisydml.methods.base import Batch, EpochContext, MethodSpec
from noisydml.methods.parts.classification import CLASSIFIER_FIELDS
from noisydml.methods.parts.codivide import CoDivideMethod
from noisydml.methods.parts.semisupervised import AUGMENT_SCHEMA, MIXMATCH_FIELDS, jensen_shannon
from noisydml.schema import Field


def uniform_selection(divergence: torch.Tensor, labels: torch.Tensor, ratio: float) -> torch.Tensor:
    """Rows labelled clean: in every class, the ⌊ratio · n_c⌋ rows (at least one) with the lowest divergence."""
    labelled = torch.zeros(len(labels), dtype=torch.bool)
    for c in torch.unique(labels):
        rows = torch.nonzero(labels == c).flatten()
        count = max(1, int(ratio * len(rows)))
        labelled[rows[torch.sort(divergence[rows], stable=True).indices[:count]]] = True
    return labelled


def selection_ratio(divergence: torch.Tensor, d_u: float, tau: float) -> float:
    """R: the share below the mean divergence, the threshold lowered towards the minimum when the mean exceeds
    ``d_u`` (the authors' filter rate)."""
    threshold = divergence.mean()
    if threshold > d_u:
        threshold = threshold - (threshold - divergence.min()) / tau
    return float((divergence < threshold).float().mean())


class Unicon(CoDivideMethod):
    trains_head = True

    def __init__(self, setup):
        super().__init__(setup)
        self.contrastive = NTXentLoss(temperature=self.hparams["contrastive_temperature"])

    def divide(self, ctx: EpochContext, main: torch.Tensor, peer: torch.Tensor) -> dict[str, torch.Tensor]:
        labels = torch.as_tensor(ctx.train_labels)
        given = torch.nn.functional.one_hot(labels, main.shape[1]).float()
        divergence = jensen_shannon((main + peer) / 2.0, given)
        ratio = selection_ratio(divergence, self.hparams["d_u"], self.hparams["tau"])
        labelled = uniform_selection(divergence, labels, ratio)
        weight = 1.0 - divergence
        return {"labelled_main": labelled, "weight_main": weight, "labelled_peer": labelled, "weight_peer": weight,
                "unicon_selection_ratio": torch.tensor(ratio), "unicon_mean_divergence": divergence.mean()}

    def extra_loss(self, batch: Batch):
        unlabelled = ~self.labelled_main[batch.index]
        if int(unlabelled.sum()) < 2:
            return 0.0, {"unicon_contrastive": 0.0}
        rows = torch.nonzero(unlabelled).flatten()
        pairs = torch.arange(len(rows), device=rows.device).repeat(2)
        total = 0.0
        for net in (None, self.peer.network):
            views = [self.setup.services.forward(batch, net, self.view(batch, v))[0][rows] for v in (3, 4)]
            total = total + self.contrastive(torch.cat(views), pairs)
        loss = self.hparams["lambda_c"] * total
        return loss, {"unicon_contrastive": total.item()}


SPEC = MethodSpec(
    build=Unicon,
    schema={**CLASSIFIER_FIELDS, **MIXMATCH_FIELDS,
            "lambda_u": Field(float, 30.0, min=0.0, help="weight of the unlabelled term after its ramp-up (the "
                                                          "authors' 30)"),
            "d_u": Field(float, 0.7, min=0.0, max=1.0, help="the mean divergence above which the threshold is "
                                                            "lowered (the authors' 0.7)"),
            "tau": Field(float, 5.0, min=1.0, help="the filter coefficient of that lowering (the authors' 5)"),
            "lambda_c": Field(float, 0.025, min=0.0, help="weight of the contrastive term (the authors' 0.025)"),
            "contrastive_temperature": Field(float, 0.5, min=1e-3,
                                             help="ours: NT-Xent's temperature (SimCLR's 0.5)")},
    nested={"augment": AUGMENT_SCHEMA},
    description="UNICON (Karim et al. 2022): uniform selection by Jensen-Shannon divergence, MixMatch and a "
                "contrastive term",
)
