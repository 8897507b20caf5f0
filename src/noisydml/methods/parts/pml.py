"""Baselines from the papers' tables, built from pytorch-metric-learning: a :class:`PMLBaseline` behind the method
interface (:func:`baseline_spec`), and the baselines several methods share.

A :class:`PMLBaseline` names a loss (and miner), its papers' default hyper-parameters
(overridable in ``methods.<name>.loss`` / ``.miner`` of params.yaml) and
whether it owns proxies (which then train with ``lr_multiplier`` times the
base learning rate, as Proxy-Anchor and SoftTriple do). A method over one baseline is a module
``methods/<name>.py`` holding its baseline (``SPEC = baseline_spec(PMLBaseline(...))``), so adding one edits no file
another method runs (docs/extending.md).

Three losses of the tables are not in pytorch-metric-learning and are ours, with their papers' equations:
ROADMAP (:mod:`~noisydml.methods.parts.roadmap`), the contextual loss (:mod:`~noisydml.methods.parts.contextual`)
and RDML's rescaled hinge (:mod:`~noisydml.methods.parts.rdml`); their pair terms are pml's ContrastiveLoss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from pytorch_metric_learning import distances, losses, miners, reducers

from noisydml.methods.base import Batch, Method, MethodSetup, MethodSpec
from noisydml.schema import Field


@dataclass(frozen=True)
class PMLBaseline:
    loss_cls: Callable[..., torch.nn.Module]
    loss_defaults: dict[str, Any]
    description: str
    #: Constructor arguments that are not hyper-parameters (e.g. the distance).
    fixed: Callable[[], dict[str, Any]] = dict
    #: Which of num_classes / embedding_size the loss constructor needs.
    needs: tuple[str, ...] = ()
    miner_cls: Callable[..., torch.nn.Module] | None = None
    miner_defaults: dict[str, Any] = field(default_factory=dict)
    lr_multiplier: float = 1.0
    #: Wrap the loss in a cross-batch memory (XBM) of ``memory_size`` embeddings.
    memory: bool = False
    #: Offer ``reduction`` (:data:`REDUCTION_FIELD`) without a memory: the PRISM authors' contrastive baseline.
    reducible: bool = False
    #: The loss keys' fields where a type alone does not say what is allowed (choices, bounds); else from defaults.
    loss_fields: dict[str, Field] = field(default_factory=dict)


def cosine() -> dict[str, Any]:
    return {"distance": distances.CosineSimilarity()}


# The baselines more than one method builds on (``ms`` and ``ms_rho1``; ``mcl``, ``prism`` and ``sgps``; ...). A
# baseline used by one method lives in that method's module, ROADMAP's and the contextual loss's in their parts
# (shared by the loss alone and SGPS around it): adding one, or editing it, touches no file another method imports.
MS = PMLBaseline(
    losses.MultiSimilarityLoss, {"alpha": 2.0, "beta": 50.0, "base": 0.5},
    "multi-similarity loss + its miner (Wang et al. 2019)",
    miner_cls=miners.MultiSimilarityMiner, miner_defaults={"epsilon": 0.1},
)
MCL = PMLBaseline(
    losses.ContrastiveLoss, {"pos_margin": 1.0, "neg_margin": 0.5},
    "memory contrastive loss: contrastive (margin 0.5 on cosine similarity) over a cross-batch "
    "memory (XBM, Wang et al. 2020; called MCL in PRISM/SGPS)",
    fixed=cosine, memory=True,
)
PROXY_ANCHOR = PMLBaseline(
    losses.ProxyAnchorLoss, {"margin": 0.1, "alpha": 32.0}, "Proxy-Anchor (Kim et al. 2020)",
    needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
)
SOFTTRIPLE = PMLBaseline(
    losses.SoftTripleLoss, {"centers_per_class": 10, "la": 20.0, "gamma": 0.1, "margin": 0.01},
    "SoftTriple (Qian et al. 2019)", needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
)
SUPCON = PMLBaseline(losses.SupConLoss, {"temperature": 0.1}, "supervised contrastive (Khosla et al. 2020)")


#: How the memory contrastive loss reduces its pair losses to one number (neither paper says).
REDUCTION_FIELD = Field(
    str, "pair_means", choices=("pair_means", "sum_over_batch"),
    help="ours: pair_means = pytorch-metric-learning's default (the mean of the non-zero positive-pair losses plus "
         "the mean of the non-zero negative-pair losses); authors' code: sum_over_batch = the sum over every pair "
         "divided by the batch size (PRISM/XBM's loss: (sum(1 - s+) + sum(s- > margin)) / B). Same pairs, other "
         "weights: on one memory the two gradients point apart (cosine 0.3-0.7) and differ ~25x in norm")
#: How much of the optimiser's weight decay a loss's own parameters (proxies, centres) get.
PROXY_WEIGHT_DECAY_FIELD = Field(
    float, 1.0, min=0.0,
    help="ours: the weight decay of the loss's own parameters (proxies, centres, Margin's betas) = the optimiser's "
         "x this; the PRISM authors' code trains proxies and centres in an optimiser of their own without weight "
         "decay (0)")


def schema_from_defaults(defaults: dict[str, Any]) -> dict[str, Field]:
    return {k: Field(type(v), v) for k, v in defaults.items()}


def loss_schema(baseline: PMLBaseline) -> dict[str, Field]:
    """The checked fields of a baseline's ``loss`` mapping: its own where given, else typed from its defaults."""
    return {**schema_from_defaults(baseline.loss_defaults), **baseline.loss_fields}


class PMLMethod(Method):
    """A pytorch-metric-learning loss (+ miner, + cross-batch memory) behind the method interface."""

    def __init__(self, setup: MethodSetup, baseline: PMLBaseline):
        super().__init__(setup)
        kwargs = {**baseline.fixed(), **setup.hparams["loss"]}
        if "num_classes" in baseline.needs:
            kwargs["num_classes"] = setup.num_classes
        if "embedding_size" in baseline.needs:
            kwargs["embedding_size"] = setup.embedding_dim
        #: the authors' reduction (REDUCTION_FIELD): pair losses summed here, divided by the batch size in loss_of
        self.sum_over_batch = setup.hparams.get("reduction") == "sum_over_batch"
        if self.sum_over_batch:
            kwargs["reducer"] = reducers.SumReducer()
        loss = baseline.loss_cls(**kwargs)
        self.miner = baseline.miner_cls(**setup.hparams["miner"]) if baseline.miner_cls else None
        if baseline.memory:
            self.loss_fn = losses.CrossBatchMemory(
                loss, setup.embedding_dim, memory_size=setup.hparams["memory_size"], miner=self.miner
            )
            self.miner = None  # the memory wrapper mines against the memory itself
        else:
            self.loss_fn = loss

    def loss(self, batch: Batch):
        return self.loss_of(batch.embeddings, batch.labels, batch.step), {}

    def loss_of(self, embeddings: torch.Tensor, labels: torch.Tensor, step: int,
                batch_size: int | None = None) -> torch.Tensor:
        """The loss of some embeddings and labels at optimisation step ``step`` (also PRISM's base loss).

        ``batch_size``: the batch the embeddings come from (PRISM passes its kept rows of a larger batch); the
        ``sum_over_batch`` reduction divides the sum over pairs by it, as the PRISM/XBM authors' code does."""
        if isinstance(self.loss_fn, losses.CrossBatchMemory) and step < self.hparams["memory_warmup_steps"]:
            # XBM's warm-up: the memory starts once features drift slowly (Wang et al. 2020, Sec. 4);
            # until then the wrapped loss sees the batch alone and nothing is enqueued.
            value = self.loss_fn.loss(embeddings, labels)
        elif self.miner is not None:
            value = self.loss_fn(embeddings, labels, self.miner(embeddings, labels))
        else:
            value = self.loss_fn(embeddings, labels)
        if self.sum_over_batch:
            value = value / (batch_size or len(embeddings))
        return value

    # The cross-batch memory keeps its queue position outside its state_dict: save it for resume.
    def get_extra_state(self):
        if isinstance(self.loss_fn, losses.CrossBatchMemory):
            return {"queue_idx": int(self.loss_fn.queue_idx), "has_been_filled": bool(self.loss_fn.has_been_filled)}
        return {}

    def set_extra_state(self, state):
        if isinstance(self.loss_fn, losses.CrossBatchMemory):
            self.loss_fn.queue_idx = state["queue_idx"]
            self.loss_fn.has_been_filled = state["has_been_filled"]


def baseline_spec(baseline: PMLBaseline) -> MethodSpec:
    schema: dict[str, Field] = {
        "loss": Field(dict, dict(baseline.loss_defaults)),
        "lr_multiplier": Field(float, baseline.lr_multiplier, min=0.0),
    }
    nested = {"loss": loss_schema(baseline)}
    if baseline.miner_cls is not None:
        schema["miner"] = Field(dict, dict(baseline.miner_defaults))
        nested["miner"] = schema_from_defaults(baseline.miner_defaults)
    if "num_classes" in baseline.needs:
        schema["proxy_weight_decay_factor"] = PROXY_WEIGHT_DECAY_FIELD
    if baseline.memory:
        schema["memory_size"] = Field(int, 8192, min=1)
        schema["memory_warmup_steps"] = Field(int, 0, min=0, help="steps on the batch alone before the memory starts")
    if baseline.memory or baseline.reducible:
        schema["reduction"] = REDUCTION_FIELD
    return MethodSpec(
        build=lambda setup: PMLMethod(setup, baseline),
        schema=schema,
        description=baseline.description,
        nested=nested,
    )
