"""A training job as the trainer takes it (:class:`Job`): the run (its :class:`~noisydml.engine.types.RunSpec`, params
after overrides), its data, where it checkpoints, what records it and how it executes.

The pipeline builds every job in one place (:mod:`noisydml.pipeline.job`: the train stage's runs, tune trials,
timing entries and every study's runs); tests and benchmarks build one directly. The checks that need the data but
no model run here, when the job is made, so a mistake fails before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from noisydml.engine.judge import GroundTruth
from noisydml.engine.types import ImageSet, NullTracker, RunSpec
from noisydml.runtime import runtime_settings
from noisydml.schema import ParamsError


@dataclass
class Job:
    """Everything one fit needs; :class:`~noisydml.engine.trainer.Trainer` runs it."""

    spec: RunSpec
    train_set: ImageSet
    test_set: ImageSet
    #: The checkpoint a killed fit resumes from (written after every epoch, rank 0).
    checkpoint_path: Path
    #: Records the fit (:class:`~noisydml.tracking.MlflowTracker`); None: nothing is recorded.
    tracker: Any = None
    #: How the fit executes: ``runtime`` with the schema's defaults for what it leaves out (tests, benchmarks).
    runtime: dict | None = None
    #: Held-out training classes (noisy labels): the only data model selection may look at.
    val_set: ImageSet | None = None
    #: Ground truth of the training rows: scores the method's decisions, never shown to the method.
    truth: GroundTruth | None = None
    #: The manifest's sample id of every training row (default: the row numbers).
    sample_ids: np.ndarray | None = None
    #: Arrays exported by upstream runs (run chaining: ``inputs``), by name, one value per row.
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: ``{"model": state_dict, "method": state_dict}`` from an upstream run, loaded before epoch 0 (never on
    #: resume: the checkpoint has the run's own state).
    init_state: dict | None = None
    #: Pretrained backbone weights (``train.pretrained``), loaded before epoch 0 (the checkpoint has them on
    #: resume); an upstream's ``init_state`` replaces them.
    backbone_state: dict | None = None
    #: The modules whose code, with the method's module, the fit runs (its stage's pipeline module): their
    #: closure's digest is part of what a checkpoint must match to be resumed.
    code: tuple[str, ...] = ("noisydml.engine.trainer",)

    def __post_init__(self):
        self.checkpoint_path = Path(self.checkpoint_path)
        self.tracker = self.tracker or NullTracker()
        self.runtime = runtime_settings(self.runtime)
        n = len(self.train_set.labels)
        self.sample_ids = np.arange(n) if self.sample_ids is None else np.asarray(self.sample_ids)
        self.inputs = self.inputs or {}
        self._check()

    @property
    def batch_size(self) -> int:
        """P x K: ``train.batch.classes`` x ``train.batch.per_class``."""
        batch = self.spec.train["batch"]
        return batch["classes"] * batch["per_class"]

    def _check(self) -> None:
        cfg = self.spec.train
        num_classes = len(np.unique(np.asarray(self.train_set.labels)))
        if cfg["batch"]["classes"] > num_classes:
            raise ParamsError(f"train.batch.classes: {cfg['batch']['classes']} classes per batch, but the training "
                              f"labels have only {num_classes} classes; allowed: 2..{num_classes}")
        if cfg["model_selection"] == "best_validation" and self.val_set is None:
            raise ValueError("Job: train.model_selection is 'best_validation' but no val_set was given (the caller "
                             "holds out train.validation_classes; the params loader checks they are > 0)")
