"""What a fit does around its epochs, as callbacks (:class:`Callback`): checkpoint and resume, tracking, the judge
of the method's decisions, model selection (keep-if-best) and the timeline; and a test seam
(:class:`StopAfterEpoch`). The loop (:class:`~noisydml.engine.trainer.Trainer`) calls their hooks in list order::

    on_fit_start(fit)                   the model, method and optimiser are built (Checkpointing restores here)
    on_train_start(fit)                 the method's on_train_start ran; the first step is next
    for every epoch:
        on_train_epoch_end(fit, epoch, row)   its steps are done (the judge scores the decisions here)
        on_validation_end(fit, epoch, row)    monitoring is in the row (keep-if-best here)
        on_epoch_end(fit, epoch, row)         the row is in the history (tracking, then the checkpoint)
    on_train_end(fit)                   after the last epoch, before the export (the reported model is chosen)
    on_fit_end(fit, result)             the result is made
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from noisydml import io
from noisydml.closure import digest as closure_digest, module_closure
from noisydml.engine.judge import decision_histograms, score_decisions

if TYPE_CHECKING:
    from noisydml.engine.state import FitState
    from noisydml.engine.types import TrainResult


def code_fingerprint(*modules: str) -> str:
    """sha256 of the package files ``modules`` run (their import closure, :func:`noisydml.closure.module_closure`,
    the same files their stage's DVC dependencies name): a checkpoint of other code is not resumed, and an edit
    anywhere else in the package leaves a killed run resumable."""
    return closure_digest(module_closure(*modules))


class Callback:
    """A fit's hook points (module docstring); every hook is optional."""

    def on_fit_start(self, fit: FitState) -> None:
        pass

    def on_train_start(self, fit: FitState) -> None:
        pass

    def on_train_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        pass

    def on_validation_end(self, fit: FitState, epoch: int, row: dict) -> None:
        pass

    def on_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        pass

    def on_train_end(self, fit: FitState) -> None:
        pass

    def on_fit_end(self, fit: FitState, result: TrainResult) -> None:
        pass


class Checkpointing(Callback):
    """After every epoch, the checkpoint a killed fit resumes from (rank 0 writes it, every rank waits for it);
    at the start, the fit continues from it when it belongs to this configuration, code and tracked runtime keys,
    else it says why not. Model, method, optimiser, schedule, scaler, history, step, best epoch, tracking run id."""

    def on_fit_start(self, fit: FitState) -> None:
        #: the digest of the code the fit runs: a checkpoint of other code is not resumed
        self.code = code_fingerprint(*fit.job.code, f"noisydml.methods.{fit.job.spec.method}")
        path = fit.job.checkpoint_path
        if not path.is_file():
            return
        state = torch.load(path, map_location=fit.strategy.device, weights_only=False)
        was = state.get("runtime") or {}
        changed = [f"runtime.{key}" for key, value in fit.runtime.items() if was.get(key) != value]
        if state.get("fingerprint") != fit.fingerprint or state.get("code") != self.code or changed:
            if state.get("fingerprint") != fit.fingerprint:
                what = "params or data"
            else:
                what = "the code" if state.get("code") != self.code else ", ".join(changed)
            print(f"ignoring checkpoint {path}: it belongs to a different configuration ({what} changed since); "
                  "training from scratch")
            return
        fit.model.load_state_dict(state["model"])
        fit.method.load_state_dict(state["method"])
        fit.optimizer.load_state_dict(state["optimizer"])
        fit.scheduler.load_state_dict(state["scheduler"])
        if fit.strategy.gpu["amp"] == "float16" and state.get("scaler"):
            fit.scaler.load_state_dict(state["scaler"])
        fit.history, fit.step, fit.run_id = state["history"], state["step"], state.get("run_id")
        fit.seconds = state.get("epoch_seconds", [])
        fit.best = state.get("best")
        fit.start_epoch = fit.resumed_from = state["epoch"] + 1
        if fit.strategy.is_main:
            print(f"resuming from {path} after epoch {fit.start_epoch} of {fit.job.spec.train['epochs']}")

    def on_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        state = {
            "fingerprint": fit.fingerprint, "code": self.code, "runtime": fit.runtime, "epoch": epoch, "step": fit.step,
            "history": fit.history,
            # waits for the MLflow run to be open (about 3 s of CPU, so after the first epoch it may not be
            # yet): a run killed before would otherwise resume as a second MLflow run
            "run_id": fit.tracker.run_id, "epoch_seconds": fit.seconds,
            "model": fit.model.state_dict(), "method": fit.method.state_dict(),
            "optimizer": fit.optimizer.state_dict(), "scheduler": fit.scheduler.state_dict(), "best": fit.best,
            **({"scaler": fit.scaler.state_dict()} if fit.strategy.gpu["amp"] == "float16" else {}),
        }
        if fit.strategy.is_main:
            io.write_with(fit.job.checkpoint_path, lambda p: torch.save(state, p))
        fit.strategy.ddp.barrier()  # no rank runs ahead of the checkpoint (a resume finds it whole)


class Tracking(Callback):
    """Opens (or, resumed, re-opens) the tracking run, logs every epoch's row (asynchronously, rank 0 only: the
    other ranks hold a tracker that records nothing) and prints it."""

    def on_train_start(self, fit: FitState) -> None:
        fit.tracker.start(fit.run_id)

    def on_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        fit.tracker.log_metrics({**{k: v for k, v in row.items() if k != "epoch"},
                                 "epoch_seconds": fit.seconds[-1]}, step=row["epoch"])
        if fit.strategy.is_main:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
                  + f" epoch_seconds={fit.seconds[-1]:.1f}")


class Judge(Callback):
    """Scores the method's decisions against ground truth the method never sees (:mod:`noisydml.engine.judge`):
    ``diag_*`` in every epoch's row, clean-vs-noisy histograms of the reported model's decisions in the result, and
    those decisions themselves (the run's ``decisions.npz``)."""

    def on_train_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        if fit.job.truth is not None:
            row.update(score_decisions(fit.method.decisions(), fit.job.truth))

    def on_fit_end(self, fit: FitState, result: TrainResult) -> None:
        result.final_decisions = fit.method.decisions()  # kept with or without truth (a user's own data)
        if fit.job.truth is not None:
            result.decision_histograms = decision_histograms(result.final_decisions, fit.job.truth)


class ModelSelection(Callback):
    """The reported model: the last epoch's, the best on the held-out training classes
    (``train.model_selection: best_validation``), or the best by the method's own score (a method that
    :attr:`~noisydml.methods.base.Method.selects_epoch`, without validation data); never the test set's."""

    def on_validation_end(self, fit: FitState, epoch: int, row: dict) -> None:
        if fit.job.spec.train["model_selection"] == "best_validation" and "val_precision_at_1" in row:
            fit.keep_if_best(epoch, row["val_precision_at_1"])
        if fit.method.selects_epoch:
            score = fit.method.selection_score()
            if score is not None:
                row["selection_score"] = float(score)
                fit.keep_if_best(epoch, float(score))

    def on_train_end(self, fit: FitState) -> None:
        fit.selected_epoch = fit.job.spec.train["epochs"]
        selecting = fit.job.spec.train["model_selection"] == "best_validation" or fit.method.selects_epoch
        if selecting and fit.best is not None:
            fit.model.load_state_dict(fit.best["model"])
            fit.method.load_state_dict(fit.best["method"])
            fit.selected_epoch = fit.best["epoch"]


class Timeline(Callback):
    """When (seconds since the epoch) this process's first training step began and its last one ended, and the
    seconds of the embedding passes after the last step (volatile, in ``result.timeline``): what lies outside them
    is the run's fixed cost (scripts/bench_launch.py)."""

    def on_train_start(self, fit: FitState) -> None:
        self.first_step = self.last_step = time.time()

    def on_train_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        self.last_step = time.time()

    def on_fit_end(self, fit: FitState, result: TrainResult) -> None:
        result.timeline = {"first_step": self.first_step, "last_step": self.last_step,
                           "final_embedding_seconds": fit.final_embedding_seconds}


class StopAfterEpoch(Callback):
    """A test seam: raise ``KeyboardInterrupt`` after epoch ``epoch``'s checkpoint (not after the last epoch), as a
    kill would. List it after :class:`Checkpointing`."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_end(self, fit: FitState, epoch: int, row: dict) -> None:
        if epoch + 1 >= self.epoch and epoch + 1 < fit.job.spec.train["epochs"]:
            raise KeyboardInterrupt(f"stopped after epoch {epoch + 1} (StopAfterEpoch)")


def default_callbacks() -> list[Callback]:
    """What every fit runs, in order: tracking before the checkpoint (which waits for the tracking run's id)."""
    return [Tracking(), Checkpointing(), Judge(), ModelSelection(), Timeline()]


def stop_after(epoch: int | None) -> list[Callback]:
    """The default callbacks, and with ``epoch`` the seam that stops the fit after that epoch's checkpoint."""
    return default_callbacks() + ([StopAfterEpoch(epoch)] if epoch is not None else [])
