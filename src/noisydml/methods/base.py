"""The method interface (v2): one trainer, many methods.

A method is an ``nn.Module`` that turns a :class:`Batch` into a loss and a dict
of numbers to log. What it owns -- proxies, heads, memory banks registered as
buffers -- is checkpointed with the model, and its trainable parameters join
the optimizer through :meth:`Method.param_groups`. Non-tensor state goes
through ``get_extra_state``/``set_extra_state`` and is checkpointed too.

Hooks, in the order the trainer calls them::

    on_train_start(ctx, restored)      once, after a checkpoint (if any) is loaded
    for every epoch:
        trainable(epoch)               which model parts are frozen this epoch
        on_epoch_start(ctx)
        for every batch: extra_samples(rows, epoch, step)   more rows to forward with it (ExtraRows; default none)
                         loss(batch); optimizer.step(); on_step_end(ctx, batch)
        on_epoch_end(ctx)
        decisions()                    per-sample decisions the trainer scores
    export(ctx)                        per-sample arrays written into the run folder

**Ground truth never reaches a method.** A method exposes its decisions
(:class:`Decisions`: keep masks, weights, pseudo-labels, confidences); the
trainer scores them against the corrupt stage's ground truth and logs the
scores as ``diag_*``. Nothing a method receives says which labels are wrong.

Adding a method never touches the trainer: write ``methods/<name>.py`` with a
module-level ``SPEC = MethodSpec(...)`` and add ``methods.<name>`` to
params.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch import nn

from noisydml.schema import Field, check_section


@dataclass(frozen=True)
class ExtraRows:
    """What :meth:`Method.extra_samples` asks for: ``rows`` of the training table to forward with the batch and,
    in ``drawn``, whatever the method drew to choose them (e.g. SGPS's positives per item). Both come back with the
    rows' embeddings on ``batch.extra`` (its :attr:`Batch.request`): no state kept between the request and the
    loss."""

    rows: np.ndarray
    drawn: Any = None


@dataclass(frozen=True)
class Batch:
    """One training batch, as a method sees it."""

    embeddings: torch.Tensor  # (B, D) L2-normalised head output
    features: torch.Tensor    # (B, F) backbone output before the head
    labels: torch.Tensor      # the labels this run trains on (noisy), 0..num_classes-1
    index: torch.Tensor       # row in this run's training table, 0..dataset_size-1 (for per-sample buffers)
    sample_id: torch.Tensor   # the manifest's global sample id (for exports)
    step: int                 # optimisation steps done before this batch
    epoch: int                # 0-based
    #: The rows :meth:`Method.extra_samples` asked for, in its order, forwarded with this batch in one pass of the
    #: model in training mode (their embeddings carry gradient; batch-norm statistics span both); None: none asked.
    extra: "Batch | None" = None
    #: On ``batch.extra``: the request it answers (:class:`ExtraRows`, with what the method drew); None elsewhere.
    request: ExtraRows | None = None

    def subset(self, mask: torch.Tensor) -> "Batch":
        """The batch restricted to ``mask`` (a bool mask or index tensor over its rows); ``extra`` is kept whole, and
        :meth:`MethodServices.forward` still gives the whole batch's rows."""
        return replace(self, embeddings=self.embeddings[mask], features=self.features[mask],
                       labels=self.labels[mask], index=self.index[mask], sample_id=self.sample_id[mask])


@dataclass
class MethodSetup:
    """What a method knows when it is built."""

    hparams: dict[str, Any]
    num_classes: int  # classes of the training labels, labelled 0..num_classes-1
    embedding_dim: int
    dataset_size: int  # rows of the training table; Batch.index is 0..dataset_size-1
    train_labels: np.ndarray  # the training labels, by row
    seed: int
    feature_dim: int = 0  # width of Batch.features (the backbone's output)
    sample_ids: np.ndarray | None = None  # manifest id of every row
    #: Arrays exported by upstream runs (run chaining: ``inputs``), by name, one value per row.
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: What the trainer does for the method beyond the batch (:class:`MethodServices`: more networks of the run's
    #: architecture, the batch's rows through them). None outside a trainer (a method that needs it says so).
    services: "MethodServices | None" = None


class MethodServices:
    """The one service object a method gets from the trainer (:attr:`MethodSetup.services`) for what lies beyond
    its batch and its epoch context: networks of the run's architecture besides the model (Co-teaching's peer,
    DivideMix's second network, LRA-diffusion's frozen encoder) and the batch's rows through them. More rows in a
    step are asked with :meth:`Method.extra_samples` (an :class:`ExtraRows` request) and come back in the batch.
    The engine implements it (:class:`noisydml.engine.state.FitServices`); a method test passes its own."""

    def build_network(self) -> nn.Module:
        """A new network of the run's architecture (backbone + head) with the run's starting backbone weights
        (pretrained, or a fresh random initialisation), on the run's device. Its parameters are the method's: they
        join the optimizer through :meth:`Method.param_groups` and the checkpoint with the method's state."""
        raise NotImplementedError

    def forward(self, batch: Batch, network: nn.Module | None = None, transform=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeddings, features)`` of ``batch``'s own rows (not ``extra``) through ``network``, or with None
        through the run's model again (one process only: DDP reduces one forward per backward). ``transform(inputs,
        rows)`` changes the network inputs first: ``inputs`` are this process's rows of the batch, ``rows`` the slice
        of the global batch they are (all of it on one process), e.g. another augmented view, or inputs mixed within
        the slice (MixMatch). Training mode, differentiable, gathered over processes like ``batch.embeddings``; rows
        in the order of the whole batch (a :meth:`Batch.subset` keeps the whole batch's). The current step's batch
        only."""
        raise NotImplementedError

    def embed_train(self, network: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeddings, features)`` of every training row through ``network``, eval mode, no augmentation, on the
        CPU (not cached)."""
        raise NotImplementedError


def services_of(setup: MethodSetup, who: str) -> MethodServices:
    """``setup.services``; a clear error naming ``who`` where the method is built outside a trainer."""
    if setup.services is None:
        raise ValueError(f"{who} trains or embeds through another network: it must be built by the trainer "
                         "(MethodSetup.services)")
    return setup.services


@dataclass
class Trainable:
    """Which parts of the model train this epoch (a method's :meth:`Method.trainable`)."""

    #: Top-level submodules of the model to freeze (``"backbone"``, ``"head"``).
    frozen: tuple[str, ...] = ()
    #: Keep the backbone's batch-norm layers in eval mode (running statistics frozen).
    freeze_batchnorm: bool = False


@dataclass
class EpochContext:
    """What a method sees in its hooks."""

    epoch: int  # 0-based
    num_epochs: int
    step: int  # optimisation steps done so far
    model: nn.Module
    device: torch.device
    train_labels: np.ndarray  # the training labels, by row
    sample_ids: np.ndarray    # manifest ids, by row
    #: ``embed_train()`` -> (N, D) embeddings of every row, eval mode, cached per step (two hooks of one
    #: step share one pass); ``embed_train(features=True)`` -> (embeddings, backbone features).
    embed_train: Callable[..., Any]
    #: ``knn(queries, k, gallery=None)`` -> (similarities, indices) by inner product on faiss (exact; GPU
    #: when available); the gallery defaults to the queries, and then each query's own row is excluded.
    knn: Callable[..., tuple[np.ndarray, np.ndarray]]
    #: ``similarity_blocks(queries, gallery, rows)`` yields (start, block) with ``block`` of ``rows`` x len(gallery):
    #: a dataset-sized similarity matrix is never built whole.
    similarity_blocks: Callable[..., Any]
    #: Arrays exported by upstream runs (run chaining: ``inputs``), by name, one value per row.
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Decisions:
    """Per-sample decisions a method wants judged, each an array over the training rows (or None).

    The trainer scores them against ground truth it never shows the method:

    - ``keep``: share of the sample's visits this epoch in which it was kept (1.0/0.0 for a single
      decision; NaN = no decision). ``visits`` (optional) weights the samples by how often they were
      seen, so per-batch selections are scored per visit. -> ``diag_selection_precision`` (kept that are
      truly clean), ``diag_selection_recall`` (truly clean that are kept), ``diag_kept_fraction``, and read as
      a noise detector ("flagged" = not kept): ``diag_flag_precision`` (flagged that are truly noisy; chance =
      the noise rate), ``diag_flag_recall`` (truly noisy that are flagged).
    - ``weights``: per-sample loss weights -> ``diag_weight_clean`` / ``diag_weight_noisy`` (means).
    - ``pseudo_labels``: labels in the training-label ids (-1 = none) -> ``diag_pseudo_label_accuracy``.
    - ``confidence``: per-sample clean confidences -> ``diag_confidence_clean`` / ``diag_confidence_noisy`` (means)
      and ``diag_confidence_auroc`` (how well they separate clean from noisy rows; 0.5 = chance).
    - ``groups``: labellings of the rows into groups (e.g. SGPS's subgroups), by name; a row's positive
      candidates are its mates in any of them -> ``diag_groups_<name>`` (count), ``diag_purity_<name>``
      (rows sharing their group's majority true class), ``diag_pool_true_positive`` / ``diag_pool_nonempty``
      (truly noisy rows of a trained class whose candidates hold a row of their true class / any row).
    - ``positives``: (rows, K) positives drawn for a row this epoch (-1 = none) ->
      ``diag_positive_precision`` (drawn positives of the anchor's true class) and ``diag_anchor_true_positive``
      (anchors with at least one).
    """

    keep: np.ndarray | None = None
    visits: np.ndarray | None = None
    weights: np.ndarray | None = None
    pseudo_labels: np.ndarray | None = None
    confidence: np.ndarray | None = None
    groups: dict[str, np.ndarray] | None = None
    positives: np.ndarray | None = None

    def present(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


class Method(nn.Module):
    """Base class of every method. Subclasses set ``schema`` and implement :meth:`loss`."""

    #: Hyper-parameters this method reads from ``methods.<name>`` in params.yaml.
    schema: ClassVar[dict[str, Field]] = {}
    #: What retrieval embeds (validation, test, the exported training embeddings): ``"embeddings"``, the head's
    #: L2-normalised output, or ``"features"``, the backbone's output L2-normalised: the penultimate layer of a
    #: classifier, as SGPS (Sec. IV-B) retrieves with its classification baselines.
    retrieval: ClassVar[str] = "embeddings"
    #: True for a method that picks the reported epoch itself (:meth:`selection_score`).
    selects_epoch: ClassVar[bool] = False

    def __init__(self, setup: MethodSetup):
        super().__init__()
        self.setup = setup
        self.hparams = setup.hparams

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    # ------------------------------------------------------------------ hooks (all optional)

    def extra_samples(self, rows: np.ndarray, epoch: int, step: int) -> ExtraRows | np.ndarray | None:
        """Rows of the training table to load and forward in the same step as the batch ``rows`` (the global
        P x K batch), e.g. K more positives per anchor chosen from the method's own groups: SGPS's authors
        forward 4 extra images per item, 64 -> 320 images a step. An :class:`ExtraRows` request (or the rows
        alone); they reach :meth:`loss` as ``batch.extra``, the request as ``batch.extra.request``.
        Chosen from the method's state and the training labels only (never ground truth); the same on every
        process (the state is). Default: None, the batch alone."""
        return None

    def on_train_start(self, ctx: EpochContext, restored: bool) -> None:
        """Once per process, before the first epoch it trains. ``restored``: state came from a checkpoint
        (a bank built here at epoch 0 must not be rebuilt on resume)."""

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        return {}

    def on_step_end(self, ctx: EpochContext, batch: Batch) -> None:
        """After ``optimizer.step()`` (momentum encoders, feature banks of the updated model)."""

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        return {}

    def decisions(self) -> Decisions | None:
        """What this method decided about the training samples this epoch (see :class:`Decisions`)."""
        return None

    def selection_score(self) -> float | None:
        """For a method that picks the reported epoch itself, without validation data (LabelWave): this epoch's
        score, asked after :meth:`on_epoch_end`; the trainer reports the model of the highest-scoring epoch (ties:
        the earliest) and refuses ``train.model_selection: best_validation`` beside it. None: no score this epoch
        (the default: the method does not select, and the trainer's ``model_selection`` decides)."""
        return None

    def export(self, ctx: EpochContext) -> dict[str, np.ndarray]:
        """Named per-row arrays to write into the run folder (``exports.npz``, keyed by sample id)."""
        return {}

    # ------------------------------------------------------------------ optimisation

    def lr_multiplier(self) -> float:
        return float(self.hparams.get("lr_multiplier", 1.0))

    def head_lr_factor(self) -> float:
        """The embedding head's learning rate / train's (on top of ``train.optimizer.head_lr_factor``); a method
        that freezes the backbone may train its head faster (default 1)."""
        return 1.0

    def param_groups(self, base_lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer groups of this method's own parameters (default: one group at ``lr_multiplier`` x lr, the
        optimizer's weight decay times ``proxy_weight_decay_factor`` where the method has one)."""
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            return []
        group = {"params": params, "lr": base_lr * self.lr_multiplier()}
        factor = float(self.hparams.get("proxy_weight_decay_factor", 1.0))
        if factor != 1.0:  # a group of the optimiser's own decay stays as before the factor existed (checkpoints)
            group["weight_decay"] = weight_decay * factor
        return [group]

    def trainable(self, epoch: int) -> Trainable:
        """Which parts of the model train in ``epoch`` (default: all of it)."""
        return Trainable()


@dataclass(frozen=True)
class MethodSpec:
    """What a method module registers: how to build the method and which hyper-parameters it takes."""

    build: Callable[[MethodSetup], Method]
    schema: dict[str, Field]
    description: str
    #: Nested sections (e.g. ``loss``, ``miner``) whose keys are checked against their own schemas.
    nested: dict[str, dict[str, Field]] | None = None
    #: Checks across keys (``validate(hparams, where)`` raises :class:`ParamsError` naming key and value).
    validate: Callable[[dict[str, Any], str], None] | None = None
    #: The per-row arrays :meth:`Method.export` writes (``exports.npz``): what a chained run's ``labels.label``,
    #: ``labels.keep`` and ``inputs`` may name (checked at load; tests/test_decisions_export.py checks the method).
    exports: tuple[str, ...] = ()

    def check(self, section: Any, where: str) -> dict[str, Any]:
        hparams = check_section(section, self.schema, where)
        for key, sub in (self.nested or {}).items():
            hparams[key] = check_section(hparams[key], sub, f"{where}.{key}")
        if self.validate is not None:
            self.validate(hparams, where)
        return hparams
