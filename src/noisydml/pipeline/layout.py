"""Where every stage reads and writes: one layout, so dvc.yaml, the stages and the report agree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: A run's embeddings of its training images (sample ids beside them).
TRAIN_EMBEDDINGS = "train_embeddings.npz"
#: A run's per-sample exports (:meth:`noisydml.methods.base.Method.export`), keyed by sample id.
EXPORTS = "exports.npz"
#: A run's own per-sample decisions on its reported model (keep, weights, confidence, pseudo-labels: what the
#: method's :class:`~noisydml.methods.base.Decisions` hold), for every method that makes any, with or without truth.
DECISIONS = "decisions.npz"
#: The pretrain stage's backbone weights (``train.pretrained: embedded``), in :attr:`Layout.pretrained`.
PRETRAINED_WEIGHTS = "backbone.pt"
#: The report stage's record of the host and numerics it ran with, beside ``all_metrics.json`` in :attr:`Layout.reports`.
HOST_RECORD = "host.json"


@dataclass(frozen=True)
class Layout:
    root: Path = Path(".")

    def raw(self, dataset: str) -> Path:
        """The download stage's output: archives, the files tree, ``download.json``."""
        return self.root / "data" / "raw" / dataset

    def prepared(self, dataset: str) -> Path:
        return self.root / "data" / "prepared" / dataset

    def noisy(self, dataset: str, noise: str) -> Path:
        return self.root / "data" / "noisy" / dataset / noise

    def run(self, dataset: str, noise: str, name: str, seed: int) -> Path:
        """A run's folder; ``name`` is the run's (:attr:`noisydml.runs.Run.name`: a grid method's, a chain's, a tuned
        or a study's run), as in every path below."""
        return self.root / "runs" / dataset / noise / name / f"seed{seed}"

    def checkpoint(self, dataset: str, noise: str, name: str, seed: int) -> Path:
        # Outside DVC's outputs: DVC deletes a stage's outputs before running it, and a
        # killed run must find its checkpoint when `dvc repro` starts it again.
        return self.root / ".checkpoints" / dataset / noise / name / f"seed{seed}" / "last.pt"

    def volatile(self, dataset: str, noise: str, name: str, seed: int) -> Path:
        """What a run measured but must not hash (seconds, MLflow run id, resume epoch): outside DVC outputs."""
        return self.root / ".runinfo" / dataset / noise / name / f"seed{seed}.json"

    def metrics(self, dataset: str, noise: str, name: str, seed: int) -> Path:
        return self.root / "metrics" / dataset / noise / name / f"seed{seed}.json"

    def curves(self, dataset: str, noise: str, name: str, seed: int) -> Path:
        """A run's training curves, drawn by the evaluate stage (matplotlib stays out of training processes)."""
        return self.root / "metrics" / dataset / noise / name / f"seed{seed}_curves.png"

    def timing(self, entry: str) -> Path:
        return self.root / "timing" / f"{entry}.json"

    @property
    def pretrained(self) -> Path:
        """The pretrain stage's output: ``backbone.pt`` and ``card.json``."""
        return self.root / "data" / "pretrained"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

