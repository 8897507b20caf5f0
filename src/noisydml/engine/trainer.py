"""The trainer: one loop for every method.

Batches are P classes x K samples (pytorch-metric-learning's MPerClassSampler,
re-seeded every epoch so a resumed run draws the same batches as an
uninterrupted one). The model is backbone + linear head + L2 normalisation;
the method turns embeddings, labels and sample ids into a loss. After every
epoch the trainer writes a checkpoint (model, method, optimizer, schedule,
history, MLflow run id); a run started again with the same configuration
continues from it, so killing ``dvc repro`` loses at most one epoch.

Test-set metrics logged during training are monitoring for the curves only:
the reported model is always the last epoch's, never the best on the test set.
"""

from __future__ import annotations

import copy

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from pytorch_metric_learning.samplers import MPerClassSampler
from pytorch_metric_learning.utils import common_functions as pml_common
from tqdm import tqdm

from noisydml import io
from noisydml.config import ParamsError
from noisydml.evaluation.retrieval import retrieval_metrics
from noisydml.methods import EpochContext, MethodSetup, build_method
from noisydml.models import build_model

CHECKPOINT_VERSION = 1
MONITOR_METRICS = ("precision_at_1", "mean_average_precision_at_r")


@dataclass
class ImageSet:
    """Images (N, H, W, C) uint8 and labels, in sample-id order."""

    images: np.ndarray
    labels: np.ndarray
    is_noisy: np.ndarray | None = None

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def tensor(self) -> torch.Tensor:
        """All images as a float tensor (N, C, H, W) scaled to [-1, 1]."""
        x = torch.from_numpy(np.ascontiguousarray(self.images)).permute(0, 3, 1, 2).float()
        return x.div_(127.5).sub_(1.0)


@dataclass
class RunSpec:
    """Everything that defines one training run (its fingerprint is taken from this)."""

    method: str
    method_hparams: dict[str, Any]
    train: dict[str, Any]
    seed: int
    data_fingerprint: str
    evaluate: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        blob = json.dumps(
            {
                "method": self.method,
                "method_hparams": self.method_hparams,
                "train": self.train,
                "seed": self.seed,
                "data": self.data_fingerprint,
                "version": CHECKPOINT_VERSION,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


class NullTracker:
    """Tracker that records nothing (tests, dry runs)."""

    run_id: str | None = None

    def start(self, run_id: str | None = None) -> str | None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def lr_factor(schedule: dict, epochs: int, steps_per_epoch: int) -> Callable[[int], float]:
    """Learning-rate factor per optimisation step: linear warm-up, then cosine / step / constant."""
    total = epochs * steps_per_epoch
    warmup = schedule["warmup_epochs"] * steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule["name"] == "cosine":
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if schedule["name"] == "step":
            return schedule["gamma"] ** ((step // steps_per_epoch) // schedule["step_epochs"])
        return 1.0

    return factor


def build_optimizer(model: torch.nn.Module, method: torch.nn.Module, opt_cfg: dict) -> torch.optim.Optimizer:
    groups = [{"params": list(model.parameters()), "lr": opt_cfg["lr"]}]
    method_params = [p for p in method.parameters() if p.requires_grad]
    if method_params:
        groups.append({"params": method_params, "lr": opt_cfg["lr"] * method.lr_multiplier()})
    name, wd = opt_cfg["name"], opt_cfg["weight_decay"]
    if name == "adam":
        return torch.optim.Adam(groups, lr=opt_cfg["lr"], weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=opt_cfg["lr"], weight_decay=wd)
    return torch.optim.SGD(groups, lr=opt_cfg["lr"], weight_decay=wd, momentum=opt_cfg["momentum"])


def _epoch_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per epoch: about one pass over the data (at least one batch)."""
    return max(num_samples, batch_size) // batch_size


def epoch_batches(labels: np.ndarray, per_class: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The P x K batches of one epoch (about one pass over the data), seeded by (seed, epoch).

    MPerClassSampler draws from the module-level numpy RNG of pytorch-metric-learning; it is
    swapped for a seeded one while the epoch's indices are drawn, then restored.
    """
    sampler = MPerClassSampler(labels, m=per_class, batch_size=batch_size,
                               length_before_new_iter=steps_per_epoch(len(labels), batch_size) * batch_size)
    saved = pml_common.NUMPY_RANDOM
    pml_common.NUMPY_RANDOM = np.random.RandomState(_epoch_seed(seed, epoch) % (2**32))
    try:
        indices = np.fromiter(iter(sampler), dtype=np.int64)
    finally:
        pml_common.NUMPY_RANDOM = saved
    return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]


@torch.no_grad()
def embed(model: torch.nn.Module, images: torch.Tensor, device: torch.device, batch_size: int = 512) -> torch.Tensor:
    was_training = model.training
    model.eval()
    out = [model(images[i : i + batch_size].to(device)).cpu() for i in range(0, len(images), batch_size)]
    model.train(was_training)
    return torch.cat(out) if out else torch.empty(0)


@dataclass
class TrainResult:
    model: torch.nn.Module
    method: torch.nn.Module
    history: list[dict[str, float]]
    test_embeddings: torch.Tensor
    #: The final model's embeddings of the training images (features for small-cluster noise, SGPS cleaning).
    train_embeddings: torch.Tensor
    resumed_from_epoch: int | None
    run_id: str | None
    #: The epoch whose model is returned: the last, or the best on the validation classes.
    selected_epoch: int | None = None
    val_embeddings: torch.Tensor | None = None


class Trainer:
    """Trains one run; see the module docstring."""

    def __init__(
        self,
        spec: RunSpec,
        train_set: ImageSet,
        test_set: ImageSet,
        checkpoint_path: str | Path,
        tracker=None,
        stop_after_epoch: int | None = None,
        progress: bool = True,
        val_set: ImageSet | None = None,
    ):
        self.spec = spec
        self.train_set = train_set
        self.test_set = test_set
        #: Held-out training classes (noisy labels): the only data model selection may look at.
        self.val_set = val_set
        self.checkpoint_path = Path(checkpoint_path)
        self.tracker = tracker or NullTracker()
        # For tests of resume: raise after this epoch's checkpoint, as a kill would.
        self.stop_after_epoch = stop_after_epoch
        self.progress = progress

    def _check_batch(self, labels: np.ndarray) -> None:
        cfg = self.spec.train["batch"]
        num_classes = len(np.unique(labels))
        if cfg["classes"] > num_classes:
            raise ParamsError(
                f"train.batch.classes: {cfg['classes']} classes per batch, but the training labels have "
                f"only {num_classes} classes; allowed: 2..{num_classes}"
            )

    def fit(self) -> TrainResult:
        cfg = self.spec.train
        if cfg["threads"]:
            torch.set_num_threads(cfg["threads"])
        device = pick_device(cfg["device"])
        labels = np.asarray(self.train_set.labels, dtype=np.int64)
        self._check_batch(labels)
        num_classes = int(labels.max()) + 1
        batch_size = cfg["batch"]["classes"] * cfg["batch"]["per_class"]

        torch.manual_seed(self.spec.seed)
        train_x = self.train_set.tensor()
        test_x = self.test_set.tensor()
        val_x = self.val_set.tensor() if self.val_set is not None else None
        select_best = cfg.get("model_selection", "last") == "best_validation"
        if select_best and val_x is None:
            raise ParamsError("train.model_selection: 'best_validation' needs train.validation_classes > 0")
        best: dict | None = None  # {"epoch", "score", "model", "method"} of the best validation epoch
        model = build_model(cfg, in_channels=train_x.shape[1]).to(device)
        method = build_method(
            self.spec.method,
            MethodSetup(
                hparams=self.spec.method_hparams,
                num_classes=num_classes,
                embedding_dim=cfg["embedding_dim"],
                dataset_size=len(labels),
                train_labels=labels,
                seed=self.spec.seed,
            ),
        ).to(device)
        optimizer = build_optimizer(model, method, cfg["optimizer"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_factor(cfg["schedule"], cfg["epochs"], steps_per_epoch(len(labels), batch_size))
        )

        fingerprint = self.spec.fingerprint()
        history: list[dict[str, float]] = []
        start_epoch, step, run_id, resumed_from = 0, 0, None, None
        if self.checkpoint_path.is_file():
            state = torch.load(self.checkpoint_path, map_location=device, weights_only=False)
            if state.get("fingerprint") == fingerprint:
                model.load_state_dict(state["model"])
                method.load_state_dict(state["method"])
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
                history, step, run_id = state["history"], state["step"], state.get("run_id")
                best = state.get("best")
                start_epoch = resumed_from = state["epoch"] + 1
                print(f"resuming from {self.checkpoint_path} after epoch {start_epoch} of {cfg['epochs']}")
            else:
                print(
                    f"ignoring checkpoint {self.checkpoint_path}: it belongs to a different configuration "
                    "(params, data or code version changed); training from scratch"
                )
        run_id = self.tracker.start(run_id)

        labels_t = torch.as_tensor(labels.copy())
        is_noisy = self.train_set.is_noisy
        ctx_kwargs = dict(
            num_epochs=cfg["epochs"], model=model, device=device, train_labels=labels,
            embed_train=lambda: embed(model, train_x, device), is_noisy=is_noisy,
        )
        for epoch in range(start_epoch, cfg["epochs"]):
            t0 = time.perf_counter()
            torch.manual_seed(_epoch_seed(self.spec.seed, epoch))
            row: dict[str, float] = {"epoch": epoch + 1}
            row.update(method.on_epoch_start(EpochContext(epoch=epoch, step=step, **ctx_kwargs)))
            model.train()
            method.train()
            batches = epoch_batches(labels, cfg["batch"]["per_class"], batch_size, self.spec.seed, epoch)
            loss_sum, logs_sum = 0.0, {}
            bar = tqdm(batches, desc=f"{self.spec.method} epoch {epoch + 1}/{cfg['epochs']}", unit="step",
                       disable=not self.progress, leave=False, mininterval=1.0)
            for idx in bar:
                ids = torch.from_numpy(idx)
                emb = model(train_x[ids].to(device))
                loss, logs = method.loss(emb, labels_t[ids].to(device), ids.to(device), step)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"{self.spec.method}: loss is {loss.item()} at epoch {epoch + 1}, step {step}; "
                        "lower train.optimizer.lr or check the method's hyper-parameters"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                loss_sum += loss.item()
                for k, v in logs.items():
                    logs_sum[k] = logs_sum.get(k, 0.0) + float(v)
                bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            row["loss"] = loss_sum / len(batches)
            row.update({k: v / len(batches) for k, v in logs_sum.items()})
            row["lr"] = optimizer.param_groups[0]["lr"]
            row.update(method.on_epoch_end(EpochContext(epoch=epoch, step=step, **ctx_kwargs)))
            row["epoch_seconds"] = time.perf_counter() - t0
            last = epoch + 1 == cfg["epochs"]
            if last or (cfg["eval_every"] and (epoch + 1) % cfg["eval_every"] == 0):
                if val_x is not None:
                    val = retrieval_metrics(
                        embed(model, val_x, device), self.val_set.labels, recall_at=(1,), nmi=False,
                        include=MONITOR_METRICS, max_k=self.spec.evaluate.get("max_k", 1023),
                    )
                    row.update({f"val_{k}": v for k, v in val.items()})
                    if select_best and (best is None or val["precision_at_1"] > best["score"]):
                        best = {"epoch": epoch + 1, "score": val["precision_at_1"],
                                "model": copy.deepcopy(model.state_dict()), "method": copy.deepcopy(method.state_dict())}
                test_emb = embed(model, test_x, device)
                monitor = retrieval_metrics(
                    test_emb, self.test_set.labels, recall_at=(1,), nmi=False, include=MONITOR_METRICS,
                    max_k=self.spec.evaluate.get("max_k", 1023),
                )
                row.update({f"test_{k}": v for k, v in monitor.items()})
            history.append(row)
            self.tracker.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=epoch + 1)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
            state = {
                "fingerprint": fingerprint, "epoch": epoch, "step": step, "history": history, "run_id": run_id,
                "model": model.state_dict(), "method": method.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "best": best,
            }
            io.write_with(self.checkpoint_path, lambda p: torch.save(state, p))
            if self.stop_after_epoch is not None and epoch + 1 >= self.stop_after_epoch and not last:
                raise KeyboardInterrupt(f"stopped after epoch {epoch + 1} (stop_after_epoch)")

        selected_epoch = cfg["epochs"]
        if select_best and best is not None:
            # chosen on the validation classes only; the test set never takes part
            model.load_state_dict(best["model"])
            method.load_state_dict(best["method"])
            selected_epoch = best["epoch"]
        test_emb = embed(model, test_x, device)
        train_emb = embed(model, train_x, device)
        val_emb = embed(model, val_x, device) if val_x is not None else None
        return TrainResult(model, method, history, test_emb, train_emb, resumed_from, run_id,
                           selected_epoch=selected_epoch, val_embeddings=val_emb)
