"""Baselines from the papers' tables, built from pytorch-metric-learning (shared by their modules).

Three losses of the tables are not in pytorch-metric-learning and are ours, with their papers' equations:
ROADMAP (:mod:`~noisydml.methods.parts.roadmap`), the contextual loss (:mod:`~noisydml.methods.parts.contextual`)
and RDML's rescaled hinge (:mod:`~noisydml.methods.parts.rdml`); their pair terms are pml's ContrastiveLoss.

Each entry names a loss (and miner), its papers' default hyper-parameters
(overridable in ``methods.<name>.loss`` / ``.miner`` of params.yaml) and
whether it owns proxies (which then train with ``lr_multiplier`` times the
base learning rate, as Proxy-Anchor and SoftTriple do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from pytorch_metric_learning import distances, losses, miners, reducers

from noisydml.methods.base import Batch, Method, MethodSetup, MethodSpec
from noisydml.methods.parts.contextual import ContextualLoss
from noisydml.methods.parts.rdml import RescaledHingeContrastiveLoss
from noisydml.methods.parts.roadmap import RANK_APPROXIMATIONS, RoadmapLoss
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
    #: The loss keys' fields where a type alone does not say what is allowed (choices, bounds); else from defaults.
    loss_fields: dict[str, Field] = field(default_factory=dict)


def cosine() -> dict[str, Any]:
    return {"distance": distances.CosineSimilarity()}


BASELINES: dict[str, PMLBaseline] = {
    "ms": PMLBaseline(
        losses.MultiSimilarityLoss, {"alpha": 2.0, "beta": 50.0, "base": 0.5},
        "multi-similarity loss + its miner (Wang et al. 2019)",
        miner_cls=miners.MultiSimilarityMiner, miner_defaults={"epsilon": 0.1},
    ),
    "contrastive": PMLBaseline(
        losses.ContrastiveLoss, {"pos_margin": 1.0, "neg_margin": 0.0},
        "contrastive loss on cosine similarities (BSPML's setting: pos margin 1, neg margin 0)", fixed=cosine,
    ),
    "triplet": PMLBaseline(
        losses.TripletMarginLoss, {"margin": 0.1, "smooth_loss": True},
        "smooth triplet loss over all triplets of the batch",
    ),
    "margin": PMLBaseline(
        losses.MarginLoss, {"margin": 0.2, "nu": 0.0, "beta": 1.2, "learn_beta": True},
        "margin loss with learned beta + distance-weighted sampling (Wu et al. 2017)",
        needs=("num_classes",), miner_cls=miners.DistanceWeightedMiner,
        miner_defaults={"cutoff": 0.5, "nonzero_loss_cutoff": 1.4},
    ),
    "fastap": PMLBaseline(losses.FastAPLoss, {"num_bins": 10}, "FastAP (Cakir et al. 2019)"),
    "proxy_anchor": PMLBaseline(
        losses.ProxyAnchorLoss, {"margin": 0.1, "alpha": 32.0}, "Proxy-Anchor (Kim et al. 2020)",
        needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
    ),
    "snr": PMLBaseline(
        losses.SignalToNoiseRatioContrastiveLoss, {"pos_margin": 0.0, "neg_margin": 1.0},
        "signal-to-noise-ratio contrastive loss (Yuan et al. 2019)",
    ),
    "softtriple": PMLBaseline(
        losses.SoftTripleLoss, {"centers_per_class": 10, "la": 20.0, "gamma": 0.1, "margin": 0.01},
        "SoftTriple (Qian et al. 2019)", needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
    ),
    "proxynca": PMLBaseline(
        losses.ProxyNCALoss, {"softmax_scale": 1.0}, "ProxyNCA (Movshovitz-Attias et al. 2017)",
        needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
    ),
    "normalized_softmax": PMLBaseline(
        losses.NormalizedSoftmaxLoss, {"temperature": 0.05}, "normalized softmax (Zhai & Wu 2019)",
        needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
    ),
    "circle": PMLBaseline(losses.CircleLoss, {"m": 0.4, "gamma": 80.0}, "Circle loss (Sun et al. 2020)"),
    "supcon": PMLBaseline(losses.SupConLoss, {"temperature": 0.1}, "supervised contrastive (Khosla et al. 2020)"),
    "mcl": PMLBaseline(
        losses.ContrastiveLoss, {"pos_margin": 1.0, "neg_margin": 0.5},
        "memory contrastive loss: contrastive (margin 0.5 on cosine similarity) over a cross-batch "
        "memory (XBM, Wang et al. 2020; called MCL in PRISM/SGPS)",
        fixed=cosine, memory=True,
    ),
    "roadmap": PMLBaseline(
        RoadmapLoss, {"tau": 0.01, "rho": 100.0, "delta": 0.05, "calibration_weight": 0.5, "pos_margin": 0.9,
                      "neg_margin": 0.6, "rank_approximation": "suprank"},
        "ROADMAP: SupAP (smooth-rank AP, an upper bound of the AP loss) + calibration loss (Ramzi et al. 2021)",
        loss_fields={
            "tau": Field(float, 0.01, min=1e-6, help="sigmoid temperature of H^- (authors' code: 0.01)"),
            "rho": Field(float, 100.0, min=0.0, help="slope of H^- past delta (authors' code: 100)"),
            "delta": Field(float, 0.05, min=0.0, help="where H^- turns linear (authors' code: 0.05)"),
            "calibration_weight": Field(float, 0.5, min=0.0, max=1.0,
                                        help="lambda: (1 - lambda) (1 - SupAP) + lambda L_calibr (authors' config: 0.5)"),
            "pos_margin": Field(float, 0.9, help="alpha of the calibration loss (authors' config: 0.9)"),
            "neg_margin": Field(float, 0.6, help="beta of the calibration loss (authors' config: 0.6)"),
            "rank_approximation": Field(str, "suprank", choices=RANK_APPROXIMATIONS,
                                        help="suprank (ROADMAP's H^-) or sigmoid (Smooth-AP's, for comparison)"),
        },
    ),
    "contextual": PMLBaseline(
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
    ),
    "rdml": PMLBaseline(
        RescaledHingeContrastiveLoss, {"eta": 1.0, "pos_margin": 1.0, "neg_margin": 0.0},
        "RDML: contrastive pair hinges, rescaled (Al-Obaidi et al. 2020; BSPML picks eta in {0.5, 1, 2, 3, 4})",
        loss_fields={
            "eta": Field(float, 1.0, min=1e-6, help="the rescaling (BSPML selects it from {0.5, 1, 2, 3, 4}; "
                                                    "1.0 untuned: ours)"),
            "pos_margin": Field(float, 1.0, help="ours: BSPML's contrastive margins, so only the rescaling differs"),
            "neg_margin": Field(float, 0.0, help="ours: BSPML's contrastive margins"),
        },
    ),
}


#: How the memory contrastive loss reduces its pair losses to one number (neither paper says).
REDUCTION_FIELD = Field(
    str, "pair_means", choices=("pair_means", "sum_over_batch"),
    help="ours: pair_means = pytorch-metric-learning's default (the mean of the non-zero positive-pair losses plus "
         "the mean of the non-zero negative-pair losses); authors' code: sum_over_batch = the sum over every pair "
         "divided by the batch size (PRISM/XBM's loss: (sum(1 - s+) + sum(s- > margin)) / B). Same pairs, other "
         "weights: on one memory the two gradients point apart (cosine 0.3-0.7) and differ ~25x in norm")


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
        self.sum_over_batch = baseline.memory and setup.hparams["reduction"] == "sum_over_batch"
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
    if baseline.memory:
        schema["memory_size"] = Field(int, 8192, min=1)
        schema["memory_warmup_steps"] = Field(int, 0, min=0, help="steps on the batch alone before the memory starts")
        schema["reduction"] = REDUCTION_FIELD
    return MethodSpec(
        build=lambda setup: PMLMethod(setup, baseline),
        schema=schema,
        description=baseline.description,
        nested=nested,
    )
