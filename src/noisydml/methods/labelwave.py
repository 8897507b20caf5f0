"""``labelwave``: LabelWave (Yuan et al., ICLR 2024, "Early stopping against label noise without validation
data") on cross-entropy training, retrieval on the penultimate features (SGPS Sec. IV-B).

A network fits the clean labels first and the noisy ones later; while it starts to memorise the noisy labels its
predictions on the training set fluctuate most. LabelWave tracks the *prediction changes* between consecutive
epochs, PC_t = |{i : ŷ_i^(t) ≠ ŷ_i^(t−1)}| over the training samples, smooths them with a moving average over
``window`` epochs, and selects the model of the epoch where the smoothed PC reaches its first minimum: once it has
not fallen for ``patience`` epochs, the selection is final. It selects an *epoch* and needs no validation data:
the trainer reports that epoch's model (``Method.selection_score``), and the test curve, logged as for every run,
only shows where the best epoch would have been (never used).

Ours, labelled in the schema: ŷ are the eval-mode predictions of every training row after each epoch (one extra
pass; no augmentation), the values of ``window`` and ``patience``.
"""

from __future__ import annotations

import torch

from noisydml.methods.base import EpochContext, MethodSetup, MethodSpec
from noisydml.methods.parts.classification import CLASSIFIER_FIELDS, ClassificationMethod
from noisydml.schema import Field


class LabelWaveSelector:
    """The stopping rule on a sequence of prediction-change counts: ``update(pc)`` -> the score of this epoch
    (−smoothed PC) while the search runs, None before the first count and once the first minimum is final."""

    def __init__(self, window: int, patience: int):
        self.window, self.patience = window, patience
        self.changes: list[int] = []
        self.best: float | None = None
        self.waited = 0
        self.final = False

    def smoothed(self) -> float:
        recent = self.changes[-self.window:]
        return sum(recent) / len(recent)

    def update(self, changes: int | None) -> float | None:
        if changes is None or self.final:
            return None
        self.changes.append(int(changes))
        value = self.smoothed()
        if self.best is None or value < self.best:
            self.best, self.waited = value, 0
        else:
            self.waited += 1
            self.final = self.waited >= self.patience
        return -value

    def state(self) -> dict:
        return {"changes": list(self.changes), "best": self.best, "waited": self.waited, "final": self.final}

    def load(self, state: dict) -> None:
        self.changes, self.best = list(state["changes"]), state["best"]
        self.waited, self.final = int(state["waited"]), bool(state["final"])


class LabelWave(ClassificationMethod):
    selects_epoch = True

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        self.register_buffer("previous", torch.full((setup.dataset_size,), -1, dtype=torch.long))
        self.selector = LabelWaveSelector(self.hparams["window"], self.hparams["patience"])
        self.score: float | None = None

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        _, features = ctx.embed_train(features=True)
        predicted = self.predictions(features).argmax(1).to(self.previous.device)
        changes = None if bool((self.previous < 0).any()) else int((predicted != self.previous).sum())
        self.previous.copy_(predicted)
        self.score = self.selector.update(changes)
        if changes is None:
            return {}
        return {"labelwave_prediction_changes": float(changes), "labelwave_smoothed": self.selector.smoothed(),
                "labelwave_final": float(self.selector.final)}

    def selection_score(self) -> float | None:
        return self.score

    def get_extra_state(self):
        return {"selector": self.selector.state(), "score": self.score}

    def set_extra_state(self, state):
        self.selector.load(state["selector"])
        self.score = state["score"]


SPEC = MethodSpec(
    build=LabelWave,
    schema={**CLASSIFIER_FIELDS,
            "window": Field(int, 3, min=1, help="ours: epochs in the moving average of the prediction changes"),
            "patience": Field(int, 3, min=1, help="ours: epochs without a new minimum before the selection is final")},
    description="LabelWave (Yuan et al. 2024): the epoch picked by prediction changes, without validation data",
)
