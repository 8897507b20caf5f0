"""``dcq_skh``: DCQ with SKH's switch (SGPS Table IV's row "DCQ [80] + SKH [86]", IJB-C TAR@1e-5 88.46 on MS1MV0).

SKH (:mod:`noisydml.methods.skh`) keeps K complete sets of class weights and trains each sample by the set that fits
it best: ``L = 1/B sum_i min_k CE_k(x_i, y_i)``. DCQ (:mod:`noisydml.methods.parts.dcq`) has no class weights to
multiply: its class weights are the momentum encoder's keys, held in a FIFO class queue (Eq. 18). Neither SKH's
paper text we hold nor its code (liubx07/SKH ``skh.py``, the classifier form only) says how the two combine, so the
combination here is **ours**, built to carry SKH's switch over unchanged:

- **K class queues** (``heads``; SKH's K), each DCQ's queue of ``queue_size`` keys, so the memory is K-fold as SKH's
  classifier is;
- **per query the minimum over the queues** of Eq. 18 (its partner's key against that queue's keys of other
  labels), the batch mean of those minima: SKH's ``min_k`` with queue k in the place of head k;
- **the key joins the winning queue only**, so a queue holds the identities that chose it, as a head's weights are
  trained only by the samples that chose it. An identity split across two labels (an inter-class conflict) can
  then keep its two labels' keys in different queues instead of each being the other's negative.

The queues start empty (DCQ's choice here, :mod:`noisydml.methods.parts.dcq`); on a tie the first queue wins (as
``torch.min``), so the first steps fill queue 0 and later queries move to the others while those have fewer
negatives. Everything else is DCQ's: pairs from the P x K batch, the momentum key encoder, s, m and the momentum.

Exposed (never shown ground truth): per epoch, the share of queries each queue won (``dcq_skh_queue_<k>_share``).
"""

from __future__ import annotations

import torch
from torch import nn

from noisydml.methods.base import Batch, MethodSetup, MethodSpec
from noisydml.methods.parts.dcq import (DCQ_SCHEMA, ClassQueue, KeyEncodedMethod, margin_softmax_losses,
                                        paired_rows)
from noisydml.schema import Field

SCHEMA = {
    **DCQ_SCHEMA,
    "queue_size": Field(int, 8192, min=1, help="keys in each of the K queues (DCQ's code: 8,192 in its one queue)"),
    "heads": Field(int, 3, min=1, help="K switchable class queues (SKH's K: skh.py's skh_k = 3)"),
}


def switched_losses(queries: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, queues: list[ClassQueue],
                    scale: float, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-query loss, winning queue)``: Eq. 18 against each queue, the minimum over the queues (SKH's switch)."""
    losses = torch.stack([margin_softmax_losses(queries, keys, labels, queue.features, queue.labels, scale, margin)
                          for queue in queues], dim=1)
    best = losses.min(dim=1)
    return best.values, best.indices


class DcqSkhMethod(KeyEncodedMethod):
    def __init__(self, setup: MethodSetup):
        super().__init__(setup, "dcq_skh")
        self.queues = nn.ModuleList(ClassQueue(self.hparams["queue_size"], setup.embedding_dim)
                                    for _ in range(self.hparams["heads"]))
        self.register_buffer("wins", torch.zeros(self.hparams["heads"], dtype=torch.float64))

    def loss(self, batch: Batch):
        hp = self.hparams
        keys = self.key_encoder.keys(batch)
        queries, partners = paired_rows(batch, hp["both_ways"], "dcq_skh")
        labels, partner_keys = batch.labels[queries], keys[partners]
        per_query, winner = switched_losses(batch.embeddings[queries], partner_keys, labels, list(self.queues),
                                            hp["scale"], hp["margin"])
        for k, queue in enumerate(self.queues):
            chose = winner == k
            queue.enqueue(partner_keys[chose], labels[chose])
        with torch.no_grad():
            self.wins += torch.bincount(winner.cpu(), minlength=hp["heads"]).to(self.wins)
        return per_query.mean(), {"dcq_queries": float(len(queries))}

    def on_epoch_start(self, ctx) -> dict[str, float]:
        self.wins.zero_()
        return {}

    def on_epoch_end(self, ctx) -> dict[str, float]:
        total = float(self.wins.sum()) or 1.0
        return {f"dcq_skh_queue_{k}_share": float(v) / total for k, v in enumerate(self.wins.tolist())}


SPEC = MethodSpec(build=DcqSkhMethod, schema=SCHEMA,
                  description="DCQ + SKH (ours: how they combine): K class queues, each query trained by its best "
                              "one, its key enqueued there")
