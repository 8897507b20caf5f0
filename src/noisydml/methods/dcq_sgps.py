"""``dcq_sgps``: SGPS around DCQ, the face-recognition row of SGPS's Table IV (Sec. IV-B, Eq. 18).

SGPS's paper gives the clean loss (Eq. 18: DCQ's margin softmax over "class centres dynamically generated from the
class queue", s 50, m 0.3) and says nothing else of the combination; the authors' repository has no face code but
a face-derived ``RSPPLoss`` (``sgps/loss/SPP_loss.py``) whose PRISM filter takes its class prototypes from a
DCQ-style ``weight_queue`` / ``label_queue``. Here, per step (:mod:`noisydml.methods.parts.dcq`,
:mod:`noisydml.methods.parts.sgps`):

1. **Keys**: every batch row through the momentum key encoder; rows pair up within their class (DCQ's two images of
   an identity, :func:`~noisydml.methods.parts.dcq.pair_rows`).
2. **PCS** (Eqs. 1-2) on the queries, with the **class queue as PRISM's memory**: ``P_clean`` from the class
   centres of the keys in the queue (Eq. 6: the mean key per label), as ``RSPPLoss``'s prototypes are; a label
   with no key in the queue is unscorable (``unscorable``).
3. **L_clean^face** (Eq. 18) on the kept queries: their partner's key against the queue's keys of other labels.
4. **L_noise** (Eqs. 13-16) on the rejected queries, SGM's subgroup positives and PPM exactly as ``sgps``'s; the
   bank term's negatives are the queue's keys (their rows' subgroups looked up as for the memory of ``sgps``).
5. **Enqueue** (ours): the keys of the pairs used in step 3 whose key row PCS kept too, so the queue, and the class
   centres PCS scores with, hold the keys of rows it trusts (PRISM enqueues only kept samples).

``positive_source: forward`` (the authors' retrieval code: K extra images per item with gradient) works as in
``sgps``. The authors' ``clean_loss_on_all`` needs a pml clean loss and is refused here.
"""

from __future__ import annotations

import torch

from noisydml.methods.base import Batch, EpochContext, MethodSetup, MethodSpec
from noisydml.methods.parts.dcq import DCQ_SCHEMA, KeyEncoder, margin_softmax_loss, paired_rows
from noisydml.methods.parts.prism import PRISM_SCHEMA
from noisydml.methods.parts.sgps import (AUTHORS_SCHEMA, SGM_SCHEMA, SGPS_EXPORTS, SGPS_SCHEMA, TRANSPROTO_SCHEMA,
                                         SgpsMethod, check_sgps)
from noisydml.schema import Field, ParamsError

#: DCQ's queue is PRISM's memory here: its size is ``memory_size`` (DCQ's code: 8,192)
SCHEMA = {
    "lr_multiplier": Field(float, 1.0, min=0.0, help="TransProto's learning rate / train's (the only own parameters)"),
    **PRISM_SCHEMA,
    "memory_size": Field(int, 8192, min=1, help="M: keys in the class queue, which is PCS's memory (DCQ's code: 8,192)"),
    **SGPS_SCHEMA,
    # Eq. 18's s and m (SGPS's margin is L_noise's delta)
    "clean_scale": Field(float, 50.0, min=1e-6, help="s of Eq. 18 (SGPS: 50)"),
    "clean_margin": Field(float, 0.3, help="m of Eq. 18 (SGPS: 0.3)"),
    "momentum": DCQ_SCHEMA["momentum"],
    "both_ways": DCQ_SCHEMA["both_ways"],
}


class DcqSgpsMethod(SgpsMethod):
    def __init__(self, setup: MethodSetup):
        super().__init__(setup, None)
        self.key_encoder = KeyEncoder(setup, "dcq_sgps (its momentum key encoder)")

    def on_train_start(self, ctx: EpochContext, restored: bool) -> None:
        if not restored:
            self.key_encoder.copy_from(ctx.model)
        super().on_train_start(ctx, restored)

    def loss(self, batch: Batch):
        hp = self.hparams
        keys = self.key_encoder.keys(batch)
        queries, partners = paired_rows(batch, hp["both_ways"], "dcq_sgps")
        scorable_share = float((self.memory.class_counts[batch.labels] > 0).float().mean())
        self.threshold.fell_back = False
        keep = self.select(batch.embeddings, batch.labels, batch.step)
        noise, logs = self.noise_loss(batch, keep)  # before the enqueue: the queue of earlier steps
        used = keep[queries]
        q, k = queries[used], partners[used]
        clean = margin_softmax_loss(batch.embeddings[q], keys[k], batch.labels[q], self.memory.features,
                                    self.memory.labels, hp["clean_scale"], hp["clean_margin"])
        enqueued = k[keep[k]]
        self.memory.enqueue(keys[enqueued], batch.labels[enqueued], batch.index[enqueued])
        self.visits.index_add_(0, batch.index, torch.ones_like(batch.index))
        self.kept_visits.index_add_(0, batch.index, keep.long())
        return clean + noise, {"fallback_rate": float(self.threshold.fell_back), "scorable_fraction": scorable_share,
                               "dcq_queries": float(len(q)), "dcq_clean": float(clean.detach()), **logs}

    def on_step_end(self, ctx: EpochContext, batch: Batch) -> None:
        super().on_step_end(ctx, batch)
        self.key_encoder.follow(ctx.model, self.hparams["momentum"])


def _validate(hp: dict, where: str) -> None:
    check_sgps(hp, where)
    if hp["authors"]["clean_loss_on_all"]:
        raise ParamsError(f"{where}.authors.clean_loss_on_all: true re-applies a pml clean loss, and DCQ's is not one; "
                          "allowed: false")


SPEC = MethodSpec(
    build=DcqSgpsMethod, schema=SCHEMA, validate=_validate,
    nested={"sgm": SGM_SCHEMA, "transproto": TRANSPROTO_SCHEMA, "authors": AUTHORS_SCHEMA}, exports=SGPS_EXPORTS,
    description="DCQ + SGPS: PCS on the class queue's centres, Eq. 18 on kept queries, L_noise on the rest "
                "(SGPS Table IV)",
)
