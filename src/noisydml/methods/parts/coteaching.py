"""Co-teaching (Han et al., NeurIPS 2018) and Co-teaching+ (Yu et al., ICML 2019): two networks teach each other
with the samples of small loss.

Co-teaching, Algorithm 1, per mini-batch D̄:

- step 4: D̄_f = argmin_{D' ⊂ D̄, |D'| ≥ R(T)|D̄|} ℓ(f, D'): the R(T) share of the batch with the smallest loss under
  network f; step 5: D̄_g likewise under g;
- step 6: update f on D̄_g, g on D̄_f (the peer's choice: the *exchange*);
- step 8: R(T) = 1 − min(T τ / T_k, τ), with τ the forget rate and T_k the epochs over which it grows.

Co-teaching+, Algorithm 1: the same exchange, restricted to the batch's *disagreement* set D̄' = {i : ŷ_i^f ≠ ŷ_i^g}
(step 4), with the small-loss share λ(e)|D̄'| of it (steps 5-6), after ``disagreement_from_epoch`` epochs of plain
Co-teaching (the authors' code starts the disagreement after an initial phase, ``init_epoch``; ours: a parameter).

What is ours, labelled in the schema: T counts the epochs done (0 in the first, so the first epoch keeps every
sample); the kept count is ⌊R(T) n⌋ (at least one); the reported model is f (the trainer's; g is the peer), retrieval
uses f's features; an empty disagreement set gives a zero loss for that batch.

Decisions judged by the trainer: ``keep`` = the share of a sample's visits this epoch in which it was in the set
that updated f (D̄_g), scored as selection precision/recall of clean samples.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from noisydml.methods.base import Batch, Decisions, EpochContext, MethodSetup, MethodSpec, services_of
from noisydml.methods.parts.classification import (CLASSIFIER_FIELDS, ClassificationMethod, PeerNetwork,
                                                   cross_entropy_per_sample)
from noisydml.schema import Field

COTEACHING_FIELDS: dict[str, Field] = {
    **CLASSIFIER_FIELDS,
    "forget_rate": Field(float, 0.5, min=0.0, max=0.99,
                         help="τ, the share of each batch dropped once the schedule is done (Han et al. set it to "
                              "the noise rate; ours: 0.5, the default grid's noise rates)"),
    "forget_epochs": Field(int, 3, min=0,
                           help="T_k, epochs over which the dropped share grows linearly to τ (paper: 10 of 200 "
                                "on CIFAR; ours: 3 of the default 12 epochs, the paper's count scaled to a short "
                                "budget; 0: τ from the first epoch)"),
}


def forget_share(epoch: int, forget_rate: float, forget_epochs: int) -> float:
    """1 − R(T) = min(T τ / T_k, τ) (Algorithm 1, step 8), with T = ``epoch`` epochs done."""
    if forget_epochs == 0:
        return forget_rate
    return min(epoch * forget_rate / forget_epochs, forget_rate)


def small_loss_rows(losses: torch.Tensor, keep_share: float) -> torch.Tensor:
    """Indices of the ⌊keep_share · n⌋ (at least one) smallest losses (Algorithm 1, steps 4-5); ties by row order."""
    n = len(losses)
    count = max(1, int(keep_share * n))
    order = torch.sort(losses.detach(), stable=True).indices
    return order[:count]


class CoTeaching(ClassificationMethod):
    """Co-teaching; with ``disagreement`` (Co-teaching+) the exchange is restricted to disagreeing predictions."""

    disagreement = False

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        self.peer = PeerNetwork(setup, self.new_classifier())
        n = setup.dataset_size
        self.register_buffer("kept_visits", torch.zeros(n))
        self.register_buffer("visits", torch.zeros(n))

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        self.kept_visits.zero_()
        self.visits.zero_()
        share = forget_share(ctx.epoch, self.hparams["forget_rate"], self.hparams["forget_epochs"])
        self.keep_share = 1.0 - share
        return {"coteaching_forget_share": share}

    def loss(self, batch: Batch):
        logits_f = self.classifier(batch.features)
        _, peer_features = services_of(self.setup, "Co-teaching").forward(batch, self.peer.network)
        logits_g = self.peer.classifier(peer_features)
        loss_f = cross_entropy_per_sample(logits_f, batch.labels)
        loss_g = cross_entropy_per_sample(logits_g, batch.labels)
        keep_share = getattr(self, "keep_share", 1.0)
        candidates = torch.arange(len(batch.labels), device=batch.labels.device)
        if self.disagreement and batch.epoch >= self.hparams["disagreement_from_epoch"]:
            candidates = candidates[logits_f.argmax(1) != logits_g.argmax(1)]  # Co-teaching+, step 4
        self.visits[batch.index] += 1
        if len(candidates) == 0:  # ours: nothing disagrees, nothing teaches
            return (logits_f.sum() + logits_g.sum()) * 0.0, {"coteaching_exchanged": 0.0}
        chosen_by_f = candidates[small_loss_rows(loss_f[candidates], keep_share)]
        chosen_by_g = candidates[small_loss_rows(loss_g[candidates], keep_share)]
        self.kept_visits[batch.index[chosen_by_g]] += 1
        # step 6: f learns from g's choice and g from f's (disjoint parameters: one backward updates both)
        loss = loss_f[chosen_by_g].mean() + loss_g[chosen_by_f].mean()
        return loss, {"coteaching_exchanged": len(chosen_by_g) / len(batch.labels)}

    def decisions(self) -> Decisions:
        visits = self.visits.cpu().numpy()
        keep = np.full(len(visits), np.nan)
        seen = visits > 0
        keep[seen] = self.kept_visits.cpu().numpy()[seen] / visits[seen]
        return Decisions(keep=keep, visits=visits)


def coteaching_spec(description: str, **defaults) -> MethodSpec:
    """Co-teaching with other defaults (``classifier``/``temperature``: Co-teaching w/ T)."""
    return MethodSpec(build=CoTeaching, schema=with_defaults(COTEACHING_FIELDS, defaults), description=description)


def with_defaults(fields: dict[str, Field], defaults: dict) -> dict[str, Field]:
    return {k: dataclasses.replace(f, default=defaults[k]) if k in defaults else f for k, f in fields.items()}
