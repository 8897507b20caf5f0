"""The values a training job is made of and gives back: the data (:class:`ImageSet`), what defines a run
(:class:`RunSpec`, whose fingerprint a checkpoint and run.json carry), what a fit returns (:class:`TrainResult`) and
the tracker that records nothing (:class:`NullTracker`). No torch work here: types only."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from noisydml.evaluation import evaluate_settings

#: Part of every run's fingerprint: a change of what a checkpoint holds bumps it.
CHECKPOINT_VERSION = 2


@dataclass
class ImageSet:
    """Images and labels, in row order. ``images``: (N, H, W, C) uint8 in memory, or
    :class:`~noisydml.data.images.ImageFiles` decoded per batch (:class:`~noisydml.data.images.InputPipeline`)."""

    images: Any
    labels: np.ndarray
    #: Evaluation sets only: True for a query row, False for a gallery row (In-Shop's protocol); None: every row
    #: is a query searched against all the others.
    query_mask: np.ndarray | None = None

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        if self.query_mask is not None and len(self.query_mask) != len(self.labels):
            raise ValueError(f"{len(self.query_mask)} query flags for {len(self.labels)} images")


@dataclass
class RunSpec:
    """Everything that defines one training run (its fingerprint is taken from this and the code)."""

    method: str
    method_hparams: dict[str, Any]
    train: dict[str, Any]
    seed: int
    data_fingerprint: str
    #: The evaluate section (its schema's defaults for what a caller leaves out): the monitor reads its ``device``
    #: only (its neighbour cap is ``train.monitor_max_k``: evaluate.max_k re-trains nothing).
    evaluate: dict[str, Any] = field(default_factory=evaluate_settings)
    #: Fingerprints of upstream runs this one takes labels, weights or inputs from (run chaining).
    upstream: dict[str, str] = field(default_factory=dict)
    #: The pretrained backbone weights it starts from: ``{"source", "sha256"}`` (empty: none / torchvision's).
    pretrained: dict[str, str] = field(default_factory=dict)

    def fingerprint(self) -> str:
        spec = {
            "method": self.method,
            "method_hparams": self.method_hparams,
            "train": self.train,
            "seed": self.seed,
            "data": self.data_fingerprint,
            "upstream": self.upstream,
            "version": CHECKPOINT_VERSION,
        }
        if self.pretrained:  # only when used: runs from scratch keep the fingerprints they had
            spec["pretrained"] = self.pretrained
        blob = json.dumps(spec, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


class NullTracker:
    """Tracker that records nothing (tests, dry runs)."""

    run_id: str | None = None

    def start(self, run_id: str | None = None) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass



@dataclass
class TrainResult:
    model: torch.nn.Module
    method: torch.nn.Module
    #: One row per epoch: loss, lr, method logs, diag_* scores, monitoring metrics (nothing volatile).
    history: list[dict[str, float]]
    test_embeddings: torch.Tensor
    #: The final model's embeddings of the training images (features for small-cluster noise, SGPS cleaning).
    train_embeddings: torch.Tensor
    resumed_from_epoch: int | None
    run_id: str | None
    #: The epoch whose model is returned: the last, or the best on the validation classes.
    selected_epoch: int | None = None
    val_embeddings: torch.Tensor | None = None
    #: Wall seconds of every epoch (volatile: kept out of the run's hashed outputs).
    epoch_seconds: list[float] = field(default_factory=list)
    #: When (seconds since the epoch) this process's first training step began and its last one ended, and the
    #: seconds of the embedding passes after the last step (volatile): what lies outside them is the run's
    #: fixed cost (scripts/bench_launch.py).
    timeline: dict[str, float] = field(default_factory=dict)
    #: The method's per-row exports (:meth:`Method.export`).
    exports: dict[str, np.ndarray] = field(default_factory=dict)
    #: Clean vs noisy histograms of the final model's decisions (weights, confidences), from ground truth.
    decision_histograms: dict[str, dict] = field(default_factory=dict)
    #: The method's decisions on the reported model (a :class:`~noisydml.methods.base.Decisions`; None: it makes
    #: none), whatever the truth: what a label audit reads of the method.
    final_decisions: Any = None
    device: dict[str, Any] = field(default_factory=dict)
