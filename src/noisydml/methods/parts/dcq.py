"""DCQ: the dynamic class queue (Li, Guo, Wen, Li, Liu, Zhang, Sun; CVPR 2021), shared by ``dcq`` and ``dcq_sgps``.

A classifier-free face-recognition loss. No ``classes x d`` weight matrix exists: every identity of a batch brings
two images; the *query* goes through the model, the *key* (the other image) through a momentum copy of it (MoCo's
key encoder), and the key acts as the identity's class weight for this step. The loss is a margin softmax (SGPS
Eq. 18, DCQ's own loss) over the query's key and the class weights of earlier steps held in a FIFO queue::

    L = -log( e^{s (q.k - m)} / (e^{s (q.k - m)} + sum_{j in queue, label_j != y} e^{s q.w_j}) )

after which the keys are enqueued with their labels (the oldest leave). s 50, m 0.3, a queue of 8,192, key-encoder
momentum 0.999 and K = 2 images per identity are DCQ's code (bilylee/DCQ ``dcq.py``, ``train.py``,
``data_proc/sampler.py``).

What is ours, each a parameter or said where it applies:

- **Pairs from a P x K batch** (:func:`pair_rows`): the rows of a class in the batch, in batch order, pair up
  (1st, 2nd), (3rd, 4th), ...; the first of a pair is the query, the second the key (DCQ's loader: one identity,
  two images, ``im_q``/``im_k``). ``both_ways: true`` (ours) also trains the second against the first's key. An odd
  row out is not a query.
- **The queue starts empty** (slots with label -1, never a negative); DCQ's code fills it with random unit vectors
  under random float labels, which are negatives of every query. Both give a first step without real negatives.
- **Every enqueued key gets a slot** (DCQ asserts the queue size is a multiple of the batch).
- **The model evaluated is the query encoder**; DCQ's code evaluates the key encoder (the momentum copy). With
  0.999 over 10,000s of steps the two are close; on a short run the key encoder lags far behind.
- **BatchNorm**: the key encoder runs in training mode on the batch (its own batch statistics); DCQ's code shuffles
  the batch across GPUs first (MoCo's shuffle-BN), which one process cannot do and our DDP path does not do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from noisydml.methods.base import Batch, EpochContext, Method, MethodSetup, MethodSpec, services_of
from noisydml.schema import Field

DCQ_SCHEMA: dict[str, Field] = {
    "queue_size": Field(int, 8192, min=1, help="class weights (keys) in the queue (DCQ's code: 8,192)"),
    "scale": Field(float, 50.0, min=1e-6, help="s of Eq. 18 (SGPS: 50, DCQ's code: 50)"),
    "margin": Field(float, 0.3, help="m of Eq. 18, on the positive cosine (SGPS: 0.3, DCQ's code: 0.3)"),
    "momentum": Field(float, 0.999, min=0.0, max=1.0,
                      help="key encoder <- momentum x key + (1 - momentum) x model, every step (DCQ's code: 0.999)"),
    "both_ways": Field(bool, False, help="ours: each pair trains both images as queries (DCQ's code: the first only)"),
}


def pair_rows(labels: torch.Tensor, both_ways: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queries, keys)``: batch positions pairing each class's rows in batch order, (1st, 2nd), (3rd, 4th), ...;
    with ``both_ways`` each pair also the other way round. No Python loop over rows."""
    labels = labels.cpu()
    order = torch.sort(labels, stable=True).indices  # each class's rows together, in batch order
    sorted_labels = labels[order]
    starts = torch.ones_like(sorted_labels, dtype=torch.bool)
    starts[1:] = sorted_labels[1:] != sorted_labels[:-1]
    group_start = torch.cummax(torch.where(starts, torch.arange(len(labels)), 0), dim=0).values
    rank = torch.arange(len(labels)) - group_start  # position of the row within its class
    is_first = rank % 2 == 0
    has_partner = torch.zeros_like(is_first)
    has_partner[:-1] = is_first[:-1] & (sorted_labels[1:] == sorted_labels[:-1])
    first = torch.nonzero(has_partner).squeeze(1)
    queries, keys = order[first], order[first + 1]
    if both_ways:
        queries, keys = torch.cat([queries, keys]), torch.cat([keys, queries])
    return queries, keys


def margin_softmax_loss(queries: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, queue: torch.Tensor,
                        queue_labels: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """Eq. 18 (SGPS) / DCQ's loss, the mean over queries: the positive logit ``s (q.k - m)`` against ``s q.w_j`` for
    every queue entry of another label (entries with label -1 are empty). ``queries``, ``keys`` and ``queue`` are
    L2-normalised; ``keys`` and ``queue`` carry no gradient."""
    if len(queries) == 0:
        return queries.sum() * 0.0
    return margin_softmax_losses(queries, keys, labels, queue, queue_labels, scale, margin).mean()


def margin_softmax_losses(queries: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, queue: torch.Tensor,
                          queue_labels: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """Eq. 18 per query (:func:`margin_softmax_loss` before its mean)."""
    positive = scale * ((queries * keys.detach()).sum(dim=1) - margin)
    negatives = scale * (queries @ queue.detach().to(queries.dtype, copy=True).T)  # the enqueue writes in place
    usable = (queue_labels[None, :] != labels[:, None]) & (queue_labels[None, :] >= 0)
    negatives = negatives.masked_fill(~usable, float("-inf"))
    logits = torch.cat([positive[:, None], negatives], dim=1)
    return torch.logsumexp(logits, dim=1) - positive


class ClassQueue(nn.Module):
    """DCQ's FIFO queue of class weights (keys) and their labels; -1 marks an empty slot. No per-class state: its
    memory is ``size x d`` whatever the number of identities."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.size = size
        self.register_buffer("features", torch.zeros(size, dim))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, labels: torch.Tensor) -> None:
        keys, labels = keys.detach().float()[-self.size:], labels.detach().long()[-self.size:]
        if len(labels) == 0:
            return
        slots = (self.pointer + torch.arange(len(labels), device=labels.device)) % self.size
        self.features[slots] = F.normalize(keys, dim=1)
        self.labels[slots] = labels
        self.pointer.fill_(int((self.pointer + len(labels)) % self.size))


class KeyEncoder(nn.Module):
    """MoCo's momentum encoder: a network of the run's architecture, never trained by the optimiser, set to the
    model's weights when training starts and moved towards them after every step."""

    def __init__(self, setup: MethodSetup, who: str):
        super().__init__()
        self.services = services_of(setup, who)
        self.network = self.services.build_network()
        self.network.requires_grad_(False)

    @staticmethod
    def _unwrapped(model: nn.Module) -> nn.Module:
        return getattr(model, "module", model)  # DDP's wrapper

    @torch.no_grad()
    def copy_from(self, model: nn.Module) -> None:
        self.network.load_state_dict(self._unwrapped(model).state_dict())

    @torch.no_grad()
    def follow(self, model: nn.Module, momentum: float) -> None:
        for key, query in zip(self.network.parameters(), self._unwrapped(model).parameters(), strict=True):
            key.mul_(momentum).add_(query.detach(), alpha=1.0 - momentum)

    @torch.no_grad()
    def keys(self, batch: Batch) -> torch.Tensor:
        """The batch's own rows through the key encoder (training mode, no gradient), L2-normalised."""
        embeddings, _ = self.services.forward(batch, self.network)
        return F.normalize(embeddings.float(), dim=1)


def paired_rows(batch: Batch, both_ways: bool, who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pair_rows` of the batch, on its device; a batch where no class has two rows is refused."""
    queries, keys = (t.to(batch.labels.device) for t in pair_rows(batch.labels, both_ways))
    if len(queries) == 0:
        raise RuntimeError(f"{who}: no class has two rows in this batch; allowed: train.batch.per_class >= 2 "
                           "(DCQ's K = 2 images per identity)")
    return queries, keys


class KeyEncodedMethod(Method):
    """A method with DCQ's momentum key encoder: the model's copy when training starts (DCQ: param_k <- param_q),
    moved towards it by ``momentum`` after every step."""

    def __init__(self, setup: MethodSetup, who: str):
        super().__init__(setup)
        self.key_encoder = KeyEncoder(setup, f"{who} (its momentum key encoder)")

    def on_train_start(self, ctx: EpochContext, restored: bool) -> None:
        if not restored:
            self.key_encoder.copy_from(ctx.model)

    def on_step_end(self, ctx: EpochContext, batch: Batch) -> None:
        self.key_encoder.follow(ctx.model, self.hparams["momentum"])


class DcqMethod(KeyEncodedMethod):
    """DCQ: queries through the model, keys through the momentum encoder, Eq. 18 against the class queue."""

    def __init__(self, setup: MethodSetup):
        super().__init__(setup, "dcq")
        self.queue = ClassQueue(self.hparams["queue_size"], setup.embedding_dim)

    def loss(self, batch: Batch):
        hp = self.hparams
        keys = self.key_encoder.keys(batch)
        queries, partners = paired_rows(batch, hp["both_ways"], "dcq")
        labels = batch.labels[queries]
        value = margin_softmax_loss(batch.embeddings[queries], keys[partners], labels, self.queue.features,
                                    self.queue.labels, hp["scale"], hp["margin"])
        self.queue.enqueue(keys[partners], labels)
        return value, {"dcq_queries": float(len(queries))}


def dcq_spec() -> MethodSpec:
    return MethodSpec(build=DcqMethod, schema=dict(DCQ_SCHEMA),
                      description="DCQ: margin softmax over a dynamic class queue of momentum-encoder keys "
                                  "(Li et al. 2021), no classifier")

