"""PRISM: probabilistic ranking-based instance selection with memory (Liu et al., CVPR 2021).

A selector in front of a base loss. Per batch (Algorithm 1 of the paper):

1. ``P_clean(i)``: the softmax over classes of the average similarity of
   ``f(x_i)`` to the memory's features of each class (Eqs. 2-3), taken at the
   sample's label. Eq. 5 shows the average similarity to class ``k`` equals
   ``<w_k, f(x_i)/||f(x_i)||>`` with the class centre ``w_k`` of Eq. 6, so with
   ``centres: true`` the softmax is over ``B x C`` products with centres kept
   up to date on every enqueue and dequeue (Eq. 7); with ``centres: false``
   it follows Eq. 3 literally (``B x M`` similarities, then a mean per class),
   which the paper reports as the slow path. A sample whose class has no
   feature in the memory gets ``P_clean = 1`` (Algorithm 1, line 3); classes
   without a centre still enter the softmax with ``w_k = 0``, as the centres
   start at zero.
2. Threshold (TRM / sTRM): ``Q_t`` is the ``floor(R * B)``-th lowest
   ``P_clean`` of the batch (R = the assumed noise rate); ``m`` is the mean of
   the last ``w`` values of ``Q`` (``w = 1``: TRM, keeps exactly the top
   ``B - floor(R * B)``). Samples with ``P_clean > m`` are kept. If none is, the
   lowest ``floor(R * B)`` are dropped instead (the authors' code, not the paper; it also restarts the window
   from ``Q_t``: ``fallback_window: reset``). ``R = 0`` keeps everything.
3. Only kept samples are enqueued (memory and centres) and passed to the base
   loss: the memory contrastive loss of Eqs. 8-9 (``prism``: XBM's contrastive
   loss with margin lambda = 0.5 over the batch and the memory, the same loss
   as the ``mcl`` baseline, so ``prism`` with ``noise_rate: 0`` *is* ``mcl``),
   or SoftTriple (``softtriple_prism``, PRISM's Table 3).

The method exposes, per epoch, which samples it kept at each visit
(:meth:`PrismMethod.decisions`); the trainer scores that against the corrupt
stage's ground truth (selection precision and recall), which PRISM never sees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from noisydml.methods.base import Batch, Decisions, EpochContext, Method, MethodSetup, MethodSpec
from noisydml.schema import Field

if TYPE_CHECKING:  # the base loss is built at run time (pml imports torch and pytorch-metric-learning)
    from noisydml.methods.parts.pml import PMLBaseline


class ClassCentreMemory(nn.Module):
    """FIFO memory of ``(feature, label)`` with per-class feature sums kept in step (Eq. 6).

    Sums are float64, so thousands of incremental updates stay equal to a
    recomputation from the memory's contents (a unit test checks this); a
    class whose last feature leaves has its sum reset to exactly zero.
    """

    def __init__(self, size: int, dim: int, num_classes: int):
        super().__init__()
        self.size, self.num_classes = size, num_classes
        self.register_buffer("features", torch.zeros(size, dim))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))
        self.register_buffer("class_sums", torch.zeros(num_classes, dim, dtype=torch.float64))
        self.register_buffer("class_counts", torch.zeros(num_classes, dtype=torch.long))
        #: training row of each entry (-1: empty or not given); SGPS looks up an entry's current subgroups by it
        self.register_buffer("rows", torch.full((size,), -1, dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, features: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        features = F.normalize(features.detach().float(), dim=1)[-self.size:]
        labels = labels.detach().long()[-self.size:]
        rows = torch.full_like(labels, -1) if rows is None else rows.detach().long()[-self.size:]
        n = len(labels)
        if n == 0:
            return
        slots = (self.pointer + torch.arange(n, device=labels.device)) % self.size
        # One scatter for dequeue and enqueue: what leaves a slot is subtracted from its class's sum
        # (empty slots, label -1, contribute zero), what enters is added.
        old_labels = self.labels[slots]
        occupied = (old_labels >= 0).to(torch.float64).unsqueeze(1)
        classes = torch.cat([old_labels.clamp(min=0), labels])
        self.class_sums.index_add_(0, classes, torch.cat([-self.features[slots].double() * occupied,
                                                          features.double()]))
        self.class_counts.index_add_(0, classes, torch.cat([-occupied.squeeze(1).long(), torch.ones_like(labels)]))
        self.class_sums.masked_fill_((self.class_counts == 0).unsqueeze(1), 0.0)
        self.features[slots] = features
        self.labels[slots] = labels
        self.rows[slots] = rows
        self.pointer.fill_(int((self.pointer + n) % self.size))

    def centres(self) -> torch.Tensor:
        """``w_k`` of Eq. 6 (zero for classes with nothing in the memory), ``(C, D)`` float32."""
        return (self.class_sums / self.class_counts.clamp(min=1).unsqueeze(1)).float()

    def average_similarity(self, normalised: torch.Tensor) -> torch.Tensor:
        """``T(x_i, k)`` of Eq. 3 computed literally: every memory feature, then a mean per class."""
        valid = self.labels >= 0
        sims = normalised @ self.features[valid].T
        totals = torch.zeros(len(normalised), self.num_classes, device=normalised.device, dtype=sims.dtype)
        totals.index_add_(1, self.labels[valid], sims)
        return totals / self.class_counts.clamp(min=1).to(sims.dtype)


def clean_probability(memory: ClassCentreMemory, embeddings: torch.Tensor, labels: torch.Tensor,
                      centres: bool = True) -> torch.Tensor:
    """``P_clean`` of every batch sample (Eq. 7 with centres, Eqs. 2-3 without); 1 for unseen classes."""
    normalised = F.normalize(embeddings.detach().float(), dim=1)
    similarity = normalised @ memory.centres().T if centres else memory.average_similarity(normalised)
    p = torch.softmax(similarity, dim=1).gather(1, labels.view(-1, 1)).squeeze(1)
    return torch.where(memory.class_counts[labels] > 0, p, torch.ones_like(p))


class SlidingThreshold(nn.Module):
    """TRM (window 1) and sTRM: the mean of the last ``window`` batch quantiles ``Q_t``, over scorable samples.

    A sample is *scorable* when its class has features in the memory. Only scorable samples are ranked:
    ``Q_t`` is the ``floor(R * n_s)``-th lowest ``P_clean`` of the ``n_s`` scorable samples of the batch.
    Unscorable samples are kept (``unscorable: keep``, our default) or dropped (``drop``). The authors' code
    ranks every sample with ``P_clean = 1`` for unscorable ones and never pushes a quantile of 1.0 into its
    window; with more classes than the memory holds (SOP: 11,318 classes, memory 8,192) most of a batch is
    unscorable, the quantile is 1.0, so the window stays empty and every batch takes the empty-window branch,
    which drops the ``floor(R * B)`` lowest: all the scorable samples and, to make up the count, unscorable ones
    in ``argsort``'s order among the tied 1.0s. Nothing scorable is ever kept (the authors' code run at SOP size:
    kept-of-scorable 0.000, kept fraction 0.50, the fallback branch never taken).
    """

    def __init__(self, noise_rate: float, window: int, keep_unscorable: bool = True, reset_on_fallback: bool = False):
        super().__init__()
        self.noise_rate, self.window, self.keep_unscorable = noise_rate, window, keep_unscorable
        #: the authors' code restarts the window from the batch's own Q_t when it falls back; the paper is silent
        self.reset_on_fallback = reset_on_fallback
        self.register_buffer("values", torch.zeros(window, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        #: whether the last call fell back to dropping the lowest floor(R * n_s) (nothing above the mean)
        self.fell_back = False

    @torch.no_grad()
    def select(self, p_clean: torch.Tensor, scorable: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """The keep mask of a batch and the threshold used (NaN when nothing is filtered)."""
        n = len(p_clean)
        scorable = torch.ones(n, dtype=torch.bool, device=p_clean.device) if scorable is None else scorable
        keep = ~scorable if self.keep_unscorable else torch.zeros(n, dtype=torch.bool, device=p_clean.device)
        self.fell_back = False
        scores = p_clean.double()[scorable]
        k = math.floor(self.noise_rate * len(scores))
        if k == 0:  # nothing to rank: keep every scorable sample, leave the window as it is
            return keep | scorable, float("nan")
        q = torch.kthvalue(scores, k).values  # the highest of the k removal candidates
        self.values[int(self.count) % self.window] = q
        self.count += 1
        threshold = self.values[: min(int(self.count), self.window)].mean()
        above = scores > threshold
        if not above.any():  # nothing above the window mean: drop the lowest k scorable samples instead
            self.fell_back = True
            above = torch.zeros(len(scores), dtype=torch.bool, device=p_clean.device)
            above[torch.argsort(scores, descending=True, stable=True)[: len(scores) - k]] = True
            if self.reset_on_fallback:  # the window restarts from this batch's Q_t alone
                self.values.zero_()
                self.values[0] = q
                self.count.fill_(1)
        keep[torch.nonzero(scorable).squeeze(1)[above]] = True
        return keep, float(threshold)


PRISM_SCHEMA = {
    "noise_rate": Field(float, 0.5, min=0.0, max=0.99,
                        help="R: the assumed noise rate; the lowest floor(R*B) scores are removal candidates; 0 = no filtering"),
    "window": Field(int, 30, min=1, help="w: batches in the sTRM window; 1 = TRM"),
    "centres": Field(bool, True, help="P_clean from class centres (Eq. 7) or from every memory feature (Eq. 3)"),
    "warmup_steps": Field(int, 0, min=0, help="steps at the start that keep every sample"),
    "memory_size": Field(int, 8192, min=1, help="M: features in the memory bank (and XBM's memory for prism)"),
    "unscorable": Field(str, "keep", choices=("keep", "drop"),
                        help="ours: samples whose class has no feature in the memory (no P_clean) are kept or dropped; "
                             "the threshold ranks scorable samples only"),
    "fallback_window": Field(str, "keep", choices=("keep", "reset"),
                             help="ours: keep = the window keeps its values when a batch falls back (nothing above "
                                  "its mean); authors' code: reset = it restarts from that batch's Q_t alone"),
}


class PrismMethod(Method):
    """PRISM's selector in front of a base loss from :mod:`noisydml.methods.parts.pml`."""

    def __init__(self, setup: MethodSetup, base: "PMLBaseline | None"):
        """``base``: the pml loss on the kept samples; None for a subclass that computes its clean loss itself
        (``dcq_sgps``: DCQ's, whose class queue is then the memory)."""
        super().__init__(setup)
        hp = setup.hparams
        self.base = None if base is None else self._pml_base(setup, base)
        self.memory = ClassCentreMemory(hp["memory_size"], setup.embedding_dim, setup.num_classes)
        self.threshold = SlidingThreshold(hp["noise_rate"], hp["window"], keep_unscorable=hp["unscorable"] == "keep",
                                          reset_on_fallback=hp["fallback_window"] == "reset")
        # This epoch's visits of every row and how many of them were kept (the decisions to be judged, and
        # the export). Buffers, so a run restored from its last checkpoint exports the same decisions.
        self.register_buffer("visits", torch.zeros(setup.dataset_size, dtype=torch.long))
        self.register_buffer("kept_visits", torch.zeros(setup.dataset_size, dtype=torch.long))
        self._last_threshold = float("nan")

    @staticmethod
    def _pml_base(setup: MethodSetup, base: "PMLBaseline"):
        from noisydml.methods.parts.pml import PMLMethod

        hp = setup.hparams
        base_hparams = {"loss": hp["loss"], "memory_size": hp["memory_size"], "miner": {}}
        if base.memory:  # a base with XBM's memory has its warm-up and reduction in prism_spec
            base_hparams["memory_warmup_steps"] = hp["memory_warmup_steps"]
            base_hparams["reduction"] = hp["reduction"]
        return PMLMethod(MethodSetup(base_hparams, setup.num_classes, setup.embedding_dim, setup.dataset_size,
                                     setup.train_labels, setup.seed), base)

    def select(self, embeddings: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor:
        """Algorithm 1, lines 1-14: the keep mask of a batch (the memory is not touched)."""
        if step < self.hparams["warmup_steps"] or self.hparams["noise_rate"] == 0:
            return torch.ones(len(labels), dtype=torch.bool, device=labels.device)
        p_clean = clean_probability(self.memory, embeddings, labels, centres=self.hparams["centres"])
        scorable = self.memory.class_counts[labels] > 0
        keep, self._last_threshold = self.threshold.select(p_clean, scorable)
        return keep

    def loss(self, batch: Batch):
        scorable_share = float((self.memory.class_counts[batch.labels] > 0).float().mean())
        self.threshold.fell_back = False
        keep = self.select(batch.embeddings, batch.labels, batch.step)
        extra, extra_logs = self.noise_loss(batch, keep)  # before the enqueue: the memory of earlier batches
        kept = batch.subset(keep)
        self.memory.enqueue(kept.embeddings, kept.labels, kept.index)  # lines 15-18: only kept samples, centres updated
        value = self.base.loss_of(kept.embeddings, kept.labels, batch.step, batch_size=len(batch.labels))
        if extra is not None:
            value = value + extra
        self.visits.index_add_(0, batch.index, torch.ones_like(batch.index))
        self.kept_visits.index_add_(0, batch.index, keep.long())
        # per batch, averaged per epoch by the trainer: scorable share, and whether the fallback was taken
        return value, {"fallback_rate": float(self.threshold.fell_back), "scorable_fraction": scorable_share,
                       **extra_logs}

    def noise_loss(self, batch: Batch, keep: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """A loss on the rejected samples (``~keep``) added to the base loss, and its logs: none in PRISM, which
        drops them; SGPS's L_noise (:mod:`noisydml.methods.parts.sgps`)."""
        return None, {}

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        self.visits.zero_()
        self.kept_visits.zero_()
        return {}

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        return {"selection_threshold": self._last_threshold}

    def _keep_fraction(self) -> tuple[np.ndarray, np.ndarray]:
        visits, kept = self.visits.cpu().numpy(), self.kept_visits.cpu().numpy()
        keep = np.full(len(visits), np.nan)
        keep[visits > 0] = kept[visits > 0] / visits[visits > 0]
        return keep, visits

    def decisions(self) -> Decisions:
        keep, visits = self._keep_fraction()
        return Decisions(keep=keep, visits=visits)

    def export(self, ctx: EpochContext) -> dict[str, np.ndarray]:
        """The final epoch's selection, for runs chained on it (e.g. a loss trained on PRISM's kept samples):
        ``keep_fraction`` (share of the sample's visits it was kept; NaN if not drawn in the last epoch) and
        ``keep`` (1 if kept in at least half its visits, or not drawn: no evidence against it)."""
        keep, _ = self._keep_fraction()
        return {"keep_fraction": keep, "keep": np.where(np.isnan(keep), 1, keep >= 0.5).astype(np.int64)}

    def lr_multiplier(self) -> float:
        return float(self.hparams["lr_multiplier"])


def selector_schema(base: "PMLBaseline") -> dict[str, Field]:
    """The hyper-parameters of PRISM's selector in front of the pml loss ``base`` (also SGPS's)."""
    from noisydml.methods.parts.pml import PROXY_WEIGHT_DECAY_FIELD, REDUCTION_FIELD

    schema = {
        "loss": Field(dict, dict(base.loss_defaults)),
        "lr_multiplier": Field(float, base.lr_multiplier, min=0.0),
        **PRISM_SCHEMA,
    }
    if "num_classes" in base.needs:
        schema["proxy_weight_decay_factor"] = PROXY_WEIGHT_DECAY_FIELD
    if base.memory:
        schema["memory_warmup_steps"] = Field(int, 0, min=0, help="steps before XBM's memory joins the loss (as mcl's)")
        schema["reduction"] = REDUCTION_FIELD
    return schema


#: :meth:`PrismMethod.export`'s arrays.
PRISM_EXPORTS = ("keep_fraction", "keep")


def prism_spec(base: "PMLBaseline", description: str) -> MethodSpec:
    """PRISM's selector in front of the pml loss ``base`` (:class:`~noisydml.methods.parts.pml.PMLBaseline`)."""
    from noisydml.methods.parts.pml import loss_schema

    return MethodSpec(
        build=lambda setup: PrismMethod(setup, base),
        schema=selector_schema(base),
        description=description,
        nested={"loss": loss_schema(base)},
        exports=PRISM_EXPORTS,
    )
