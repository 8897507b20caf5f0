"""The method interface: one trainer, many methods.

A method turns a batch's embeddings, (noisy) labels and sample ids into a loss
and a dict of numbers to log. It is an ``nn.Module``, so whatever it owns --
proxies, heads, memory banks registered as buffers -- is checkpointed with the
model and its trainable parameters join the optimizer (with the method's own
learning-rate multiplier). Non-tensor state goes through
``get_extra_state``/``set_extra_state`` and is checkpointed too.

Epoch-level work (weight solvers, subgrouping, phase switches) goes in
:meth:`Method.on_epoch_start` / :meth:`Method.on_epoch_end`, which receive an
:class:`EpochContext` with the model, the training data and a helper that
embeds the whole training set. Adding a method never touches the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch import nn

from noisydml.config import Field, check_section


@dataclass
class MethodSetup:
    """What a method knows when it is built."""

    hparams: dict[str, Any]
    num_classes: int  # classes of the (noisy) training labels, labelled 0..num_classes-1
    embedding_dim: int
    dataset_size: int  # training samples; sample ids are 0..dataset_size-1
    train_labels: np.ndarray  # the noisy training labels, indexed by sample id
    seed: int


@dataclass
class EpochContext:
    """What a method sees between epochs."""

    epoch: int  # 0-based
    num_epochs: int
    step: int  # optimisation steps done so far
    model: nn.Module
    device: torch.device
    train_labels: np.ndarray  # noisy labels by sample id
    #: Embeds every training sample in sample-id order, without augmentation, in eval mode.
    embed_train: Callable[[], torch.Tensor]
    #: Ground truth from the corrupt stage, for diagnostics only (never for training decisions).
    is_noisy: np.ndarray | None = None


class Method(nn.Module):
    """Base class of every method. Subclasses set ``schema`` and implement :meth:`loss`."""

    #: Hyper-parameters this method reads from ``methods.<name>`` in params.yaml.
    schema: ClassVar[dict[str, Field]] = {}

    def __init__(self, setup: MethodSetup):
        super().__init__()
        self.setup = setup
        self.hparams = setup.hparams

    def loss(
        self, embeddings: torch.Tensor, labels: torch.Tensor, sample_ids: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        return {}

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        return {}

    def lr_multiplier(self) -> float:
        return float(self.hparams.get("lr_multiplier", 1.0))


@dataclass(frozen=True)
class MethodSpec:
    """A registry entry: how to build a method and which hyper-parameters it takes."""

    build: Callable[[MethodSetup], Method]
    schema: dict[str, Field]
    description: str
    #: Nested sections (e.g. ``loss``, ``miner``) whose keys are checked against their own schemas.
    nested: dict[str, dict[str, Field]] | None = None

    def check(self, section: Any, where: str) -> dict[str, Any]:
        hparams = check_section(section, self.schema, where)
        for key, sub in (self.nested or {}).items():
            hparams[key] = check_section(hparams[key], sub, f"{where}.{key}")
        return hparams
