"""``dividemix``: DivideMix (Li, Socher & Hoi, ICLR 2020): co-divide by a Gaussian mixture over per-sample losses,
then MixMatch with co-refinement and co-guessing; retrieval on the penultimate features (SGPS Sec. IV-B).

The division (Algorithm 1, lines 4-8; Eqs. 1-2): after the warm-up, at the start of every epoch, each network's
cross-entropy of the given label on every training row, min-max normalised, is fitted with a two-component GMM
(:func:`~noisydml.methods.parts.semisupervised.gmm_clean_probability`); a row's clean probability w_i is its
posterior of the low-loss component, and it is labelled when w_i > ``p_threshold`` (0.5). Each network trains on
the division the *other* made (co-divide). The step is :mod:`noisydml.methods.parts.codivide`'s.
"""

import numpy as np
import torch
import torch.nn.functional as F

from noisydml.methods.base import EpochContext, MethodSpec
from noisydml.methods.parts.classification import CLASSIFIER_FIELDS
from noisydml.methods.parts.codivide import CoDivideMethod
from noisydml.methods.parts.semisupervised import AUGMENT_SCHEMA, MIXMATCH_FIELDS, gmm_clean_probability
from noisydml.schema import Field


class DivideMix(CoDivideMethod):
    def divide(self, ctx: EpochContext, main: torch.Tensor, peer: torch.Tensor) -> dict[str, torch.Tensor]:
        labels = torch.as_tensor(ctx.train_labels)
        seed = int(np.random.SeedSequence([self.setup.seed, ctx.epoch]).generate_state(1)[0])
        w = {}
        for name, probabilities in (("main", main), ("peer", peer)):
            losses = F.nll_loss(torch.log(probabilities.clamp_min(1e-12)), labels, reduction="none")
            w[name] = torch.as_tensor(gmm_clean_probability(losses.numpy(), seed), dtype=torch.float32)
        threshold = self.hparams["p_threshold"]
        # co-divide: net 1 trains on net 2's division and net 2 on net 1's
        return {"weight_main": w["peer"], "labelled_main": w["peer"] > threshold,
                "weight_peer": w["main"], "labelled_peer": w["main"] > threshold}


SPEC = MethodSpec(
    build=DivideMix,
    schema={**CLASSIFIER_FIELDS, **MIXMATCH_FIELDS,
            "p_threshold": Field(float, 0.5, min=0.0, max=1.0,
                                 help="clean-probability threshold of the division (the paper's 0.5)")},
    nested={"augment": AUGMENT_SCHEMA},
    description="DivideMix (Li et al. 2020): co-divide by a loss GMM, then MixMatch with co-refinement and "
                "co-guessing",
)
