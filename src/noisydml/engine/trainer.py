"""The trainer: one loop for every method.

Batches are P classes x K samples (pytorch-metric-learning's MPerClassSampler,
re-seeded every epoch so a resumed run draws the same batches as an
uninterrupted one). The model is backbone + linear head + L2 normalisation;
the method (:mod:`noisydml.methods.base`) turns a :class:`~noisydml.methods.base.Batch`
into a loss. After every epoch the trainer scores the method's decisions
against ground truth the method never sees (:mod:`noisydml.engine.judge`) and
writes a checkpoint (model, method, optimizer, schedule, history, MLflow run
id); a run started again with the same configuration *and code* continues from
it, so killing ``dvc repro`` loses at most one epoch.

Under ``torchrun`` (``runtime.processes`` > 1) one run trains on several processes with PyTorch's DDP: each
rank forwards its share of the batch, the method sees the gathered global batch, rank 0 writes checkpoints and
records (:mod:`noisydml.engine.distributed`). A one-process run takes none of those paths.

Test-set metrics logged during training are monitoring for the curves only:
the reported model is the last epoch's, or the best on held-out *training*
classes, never the best on the test set.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from pytorch_metric_learning.samplers import MPerClassSampler
from pytorch_metric_learning.utils import common_functions as pml_common
from tqdm import tqdm

from noisydml import io, neighbours
from noisydml.closure import digest as closure_digest, module_closure
from noisydml.data.images import InputPipeline, image_channels
from noisydml.engine import distributed
from noisydml.engine.eager_optim import eager
from noisydml.engine.judge import GroundTruth, decision_histograms, score_decisions
from noisydml.evaluation import evaluate_settings
from noisydml.evaluation.retrieval import retrieval_metrics
from noisydml.methods import build_method
from noisydml.methods.base import Batch, EpochContext, MethodSetup
from noisydml.models import build_model, load_backbone_weights
from noisydml.runtime import runtime_settings, tracked_runtime
from noisydml.schema import ParamsError

CHECKPOINT_VERSION = 2
MONITOR_METRICS = ("precision_at_1", "mean_average_precision_at_r")


def gpu_settings(runtime: dict, device: torch.device) -> dict[str, Any]:
    """``runtime``'s GPU switches as they take effect on ``device`` (recorded in run.json): automatic mixed
    precision (``amp``: ``float32``, ``float16`` autocast + gradient scaling, or ``bfloat16`` autocast), channels-last
    memory format and cuDNN's autotuner act on CUDA only; on the CPU they are off, and a requested one says so
    (float32, the default format: bit-exact)."""
    cuda = device.type == "cuda"
    for key in ("amp", "channels_last", "cudnn_benchmark"):
        if runtime[key] not in (False, "float32") and not cuda:
            print(f"runtime.{key}: no CUDA device; off on the CPU")
    settings = {"amp": runtime["amp"] if cuda else "float32", "channels_last": bool(runtime["channels_last"] and cuda),
                "cudnn_benchmark": bool(runtime["cudnn_benchmark"] and cuda and not runtime["deterministic"]),
                "deterministic": bool(runtime["deterministic"])}
    if cuda:
        torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = settings["deterministic"]
    return settings


def autocast(device: torch.device, amp: str):
    """The forward's autocast context for ``runtime.amp`` as it took effect (:func:`gpu_settings`)."""
    if amp == "float32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=getattr(torch, amp))


def code_fingerprint(*modules: str) -> str:
    """sha256 of the package files ``modules`` run (their import closure, :func:`noisydml.closure.module_closure`,
    the same files their stage's DVC dependencies name): a checkpoint of other code is not resumed, and an edit
    anywhere else in the package leaves a killed run resumable."""
    return closure_digest(module_closure(*modules))


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
    #: The evaluate section (its schema's defaults for what a caller leaves out): monitoring's retrieval settings.
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


def pick_device(name: str) -> torch.device:
    """``runtime.device``: ``cuda`` must exist; ``auto`` says when it falls back to the CPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("runtime.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        print("runtime.device auto: no CUDA device here, training on the CPU")
        return torch.device("cpu")
    return torch.device(name)


def describe_device(device: torch.device) -> dict[str, Any]:
    """The resolved device and library versions, for run.json."""
    import faiss
    import pytorch_metric_learning

    out: dict[str, Any] = {"device": str(device), "torch": torch.__version__,
                           "pytorch_metric_learning": pytorch_metric_learning.__version__,
                           "faiss": getattr(faiss, "__version__", "unknown")}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def lr_factor(schedule: dict, epochs: int, steps_per_epoch: int) -> Callable[[int], float]:
    """Learning-rate factor per optimisation step: linear warm-up, then cosine / step / constant."""
    total = epochs * steps_per_epoch
    warmup = schedule["warmup_epochs"] * steps_per_epoch

    if schedule["name"] == "warmup_hold_cosine":
        return _warmup_hold_cosine(schedule)

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


def _warmup_hold_cosine(schedule: dict) -> Callable[[int], float]:
    """The SGPS authors' ``SequentialLR([LinearLR, CosineAnnealingLR], milestones=[cosine_from_step])`` in closed
    form: linear from ``warmup_start_factor`` to 1 over ``warmup_steps``, 1 until ``cosine_from_step``, then
    ``(1 + cos(pi t / cosine_steps)) / 2`` with ``t`` the steps since (periodic, as torch's closed form)."""
    start, ramp = schedule["warmup_start_factor"], schedule["warmup_steps"]
    begin, period = schedule["cosine_from_step"], schedule["cosine_steps"]

    def factor(step: int) -> float:
        if step >= begin:
            return 0.5 * (1.0 + math.cos(math.pi * (step - begin) / period))
        if step < ramp:
            return start + (1.0 - start) * step / ramp
        return 1.0

    return factor


def build_optimizer(model: torch.nn.Module, method, opt_cfg: dict) -> torch.optim.Optimizer:
    """The backbone at the base lr, the embedding head at ``head_lr_factor`` x the method's
    :meth:`~noisydml.methods.base.Method.head_lr_factor` x lr (both ours), then the method's own groups
    (:meth:`Method.param_groups`). With a factor of 1 the model stays one group, as before the factor existed,
    so checkpoints keep their layout."""
    head_factor = opt_cfg["head_lr_factor"] * method.head_lr_factor()
    if head_factor == 1.0 or not hasattr(model, "head"):
        groups = [{"params": list(model.parameters()), "lr": opt_cfg["lr"]}]
    else:
        head = {id(p) for p in model.head.parameters()}
        groups = [{"params": [p for p in model.parameters() if id(p) not in head], "lr": opt_cfg["lr"]},
                  {"params": list(model.head.parameters()), "lr": opt_cfg["lr"] * head_factor}]
    groups += method.param_groups(opt_cfg["lr"], opt_cfg["weight_decay"])
    name, wd = opt_cfg["name"], opt_cfg["weight_decay"]
    if name in ("adam", "adamw"):
        betas = tuple(opt_cfg["betas"])  # two numbers (checked with params)
        adam = eager(torch.optim.Adam if name == "adam" else torch.optim.AdamW)
        return adam(groups, lr=opt_cfg["lr"], betas=betas, weight_decay=wd)
    return eager(torch.optim.SGD)(groups, lr=opt_cfg["lr"], weight_decay=wd, momentum=opt_cfg["momentum"])


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
def embed(model: torch.nn.Module, images, device: torch.device, batch_size: int = 512,
          features: bool = False, pipeline: InputPipeline | None = None):
    """Embeddings (and with ``features`` the backbone features) of ``images``, eval mode, on the CPU.

    ``images``: uint8 arrays, :class:`~noisydml.data.images.ImageFiles` (decoded and eval-transformed by
    ``pipeline``) or a float tensor of network inputs."""
    pipeline = pipeline or InputPipeline()
    # each module's own mode comes back (a frozen batch-norm stays in eval mode inside a training epoch)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    embs, feats = [], []
    for x in pipeline.eval_batches(images, batch_size):
        e, f = model.forward_with_features(x.to(device, non_blocking=True))
        embs.append(e.cpu())
        feats.append(f.cpu())
    for module, mode in modes:
        module.training = mode
    emb = torch.cat(embs) if embs else torch.empty(0)
    if not features:
        return emb
    return emb, (torch.cat(feats) if feats else torch.empty(0))


class _ForwardWithFeatures(torch.nn.Module):
    """The model with ``forward_with_features`` as its forward: the module DDP wraps (DDP hooks ``forward``)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        return self.model.forward_with_features(x)


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
    device: dict[str, Any] = field(default_factory=dict)


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
        runtime: dict | None = None,
        val_set: ImageSet | None = None,
        truth: GroundTruth | None = None,
        sample_ids: np.ndarray | None = None,
        inputs: dict[str, np.ndarray] | None = None,
        init_state: dict | None = None,
        progress: bool | None = None,
        backbone_state: dict | None = None,
        code: tuple[str, ...] = ("noisydml.engine.trainer",),
    ):
        self.spec = spec
        #: The modules whose code, with the method's module, the run runs (its stage's pipeline module): their
        #: closure's digest is part of what a checkpoint must match to be resumed.
        self.code = code
        self.train_set = train_set
        self.test_set = test_set
        #: Held-out training classes (noisy labels): the only data model selection may look at.
        self.val_set = val_set
        self.checkpoint_path = Path(checkpoint_path)
        self.tracker = tracker or NullTracker()
        # For tests of resume: raise after this epoch's checkpoint, as a kill would.
        self.stop_after_epoch = stop_after_epoch
        #: How the run executes: ``runtime`` with the schema's defaults for what it leaves out (tests, benchmarks)
        self.runtime = runtime_settings(runtime)
        if progress is not None:
            self.runtime["progress"] = progress
        #: Ground truth of the training rows: scores the method's decisions, never shown to the method.
        self.truth = truth
        n = len(train_set.labels)
        self.sample_ids = np.arange(n) if sample_ids is None else np.asarray(sample_ids)
        self.inputs = inputs or {}
        #: ``{"model": state_dict, "method": state_dict}`` from an upstream run, loaded before epoch 0
        #: (never on resume: the checkpoint has the run's own state).
        self.init_state = init_state
        #: Pretrained backbone weights (``train.pretrained``), loaded before epoch 0 (the checkpoint has them
        #: on resume); an upstream's ``init_state`` replaces them.
        self.backbone_state = backbone_state

    def fit(self) -> TrainResult:
        """Template: build, restore, then per epoch train / monitor / record / save, then select and export.

        Each step is a method below; the order of every random draw is that of one loop, so a resumed run
        reproduces an uninterrupted one bit for bit."""
        run = self._build()
        self._restore(run)
        run.tracker.start(run.run_id)  # opens (or re-opens) the MLflow run; metrics are then logged asynchronously
        run.wrap_for_ddp()
        run.method.on_train_start(run.context(run.start_epoch), restored=run.resumed_from is not None)
        epochs = self.spec.train["epochs"]
        timeline = {"first_step": time.time(), "last_step": time.time(), "final_embedding_seconds": 0.0}
        for epoch in range(run.start_epoch, epochs):
            t0 = time.perf_counter()
            row = self._train_epoch(run, epoch)
            run.seconds.append(time.perf_counter() - t0)
            timeline["last_step"] = time.time()
            last = epoch + 1 == epochs
            if last or (self.spec.train["eval_every"] and (epoch + 1) % self.spec.train["eval_every"] == 0):
                t0 = time.perf_counter()
                row.update(self._monitor(run, epoch, last))
                if last:
                    timeline["final_embedding_seconds"] += time.perf_counter() - t0
            self._method_selects(run, epoch, row)
            self._record(run, row)
            self._save(run, epoch)
            if self.stop_after_epoch is not None and epoch + 1 >= self.stop_after_epoch and not last:
                raise KeyboardInterrupt(f"stopped after epoch {epoch + 1} (stop_after_epoch)")
        self._select(run)
        t0 = time.perf_counter()
        result = self._export(run)
        timeline["final_embedding_seconds"] += time.perf_counter() - t0
        result.timeline = timeline
        return result

    # ------------------------------------------------------------------ steps

    def _build(self) -> "_Run":
        """Device, seeds, input pipeline, model (pretrained or upstream weights), method, optimizer, schedule."""
        cfg, runtime = self.spec.train, self.runtime
        if runtime["threads"]:
            torch.set_num_threads(runtime["threads"])
        if runtime["deterministic"]:
            torch.use_deterministic_algorithms(True, warn_only=True)
        device = pick_device(runtime["device"])
        if runtime["deterministic"] and device.type == "cuda" and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
            # cuBLAS is deterministic only with a fixed workspace, read when its first handle is made
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            print("runtime.deterministic on CUDA: CUBLAS_WORKSPACE_CONFIG=:4096:8 (cuBLAS's deterministic workspace)"
                  + ("; CUDA was already in use in this process, so cuBLAS may not be bit-exact: set it before "
                     "starting" if torch.cuda.is_initialized() else ""))
        gpu = gpu_settings(runtime, device)
        ddp = distributed.current()
        labels = np.asarray(self.train_set.labels, dtype=np.int64)
        num_classes = len(np.unique(labels))
        if cfg["batch"]["classes"] > num_classes:
            raise ParamsError(f"train.batch.classes: {cfg['batch']['classes']} classes per batch, but the training "
                              f"labels have only {num_classes} classes; allowed: 2..{num_classes}")
        batch_size = cfg["batch"]["classes"] * cfg["batch"]["per_class"]
        ddp.check_batch(batch_size)
        if cfg["model_selection"] == "best_validation" and self.val_set is None:
            raise ValueError("Trainer: train.model_selection is 'best_validation' but no val_set was given (the "
                             "caller holds out train.validation_classes; the params loader checks they are > 0)")

        torch.manual_seed(self.spec.seed)
        pipeline = InputPipeline.from_params(cfg, runtime, self.spec.seed, device)
        in_channels = image_channels(self.train_set.images)

        def build_network() -> torch.nn.Module:
            """A network of this run's architecture and starting weights: the model, and a method's peer."""
            net = build_model(cfg, in_channels=in_channels)
            if self.backbone_state is not None:
                load_backbone_weights(net.backbone, self.backbone_state, cfg["pretrained"])
            net = net.to(device)
            return net.to(memory_format=torch.channels_last) if gpu["channels_last"] else net

        model = build_network()
        if ddp.active:
            gpu["distributed"] = ddp.describe()
            gpu["distributed"]["sync_batchnorm"] = bool(runtime["sync_batchnorm"] and device.type == "cuda")
            if gpu["distributed"]["sync_batchnorm"]:
                model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            elif runtime["sync_batchnorm"] and ddp.is_main:
                print("runtime.sync_batchnorm: PyTorch's SyncBatchNorm needs CUDA; batch-norm statistics are per rank")
        method = build_method(
            self.spec.method,
            MethodSetup(hparams=self.spec.method_hparams, num_classes=int(labels.max()) + 1,
                        embedding_dim=cfg["embedding_dim"], dataset_size=len(labels), train_labels=labels,
                        seed=self.spec.seed, feature_dim=int(getattr(model.backbone, "out_dim", 0)),
                        sample_ids=self.sample_ids, inputs=self.inputs, build_network=build_network),
        ).to(device)
        if method.retrieval not in ("embeddings", "features"):
            raise ValueError(f"{self.spec.method}.retrieval is {method.retrieval!r}; allowed: embeddings, features")
        if method.selects_epoch and cfg["model_selection"] != "last":
            raise ParamsError(f"train.model_selection: {cfg['model_selection']!r}, but {self.spec.method} selects the "
                              "reported epoch itself (without validation data); allowed: last")
        if self.init_state is not None:
            model.load_state_dict(self.init_state["model"])
            if self.init_state.get("method") is not None:
                method.load_state_dict(self.init_state["method"])
        optimizer = build_optimizer(model, method, cfg["optimizer"])
        # float16 only (bfloat16 has float32's range): disabled, scale() and step() are the identity and
        # optimizer.step()
        scaler = torch.amp.GradScaler("cuda", enabled=gpu["amp"] == "float16")
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_factor(cfg["schedule"], cfg["epochs"], steps_per_epoch(len(labels), batch_size)))
        # ranks other than 0 record nothing: rank 0 holds the MLflow run and writes the checkpoint
        tracker = self.tracker if ddp.is_main else NullTracker()
        return _Run(self, device=device, gpu=gpu, ddp=ddp, tracker=tracker, pipeline=pipeline, labels=labels,
                    batch_size=batch_size, model=model, method=method, optimizer=optimizer, scaler=scaler,
                    scheduler=scheduler)

    def _restore(self, run: "_Run") -> None:
        """Continue from the checkpoint when it belongs to this configuration and code; else say why not."""
        if not self.checkpoint_path.is_file():
            return
        state = torch.load(self.checkpoint_path, map_location=run.device, weights_only=False)
        was = state.get("runtime") or {}
        changed = [f"runtime.{key}" for key, value in run.runtime.items() if was.get(key) != value]
        if state.get("fingerprint") != run.fingerprint or state.get("code") != run.code or changed:
            if state.get("fingerprint") != run.fingerprint:
                what = "params or data"
            else:
                what = "the code" if state.get("code") != run.code else ", ".join(changed)
            print(f"ignoring checkpoint {self.checkpoint_path}: it belongs to a different configuration "
                  f"({what} changed since); training from scratch")
            return
        run.model.load_state_dict(state["model"])
        run.method.load_state_dict(state["method"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        if run.gpu["amp"] == "float16" and state.get("scaler"):
            run.scaler.load_state_dict(state["scaler"])
        run.history, run.step, run.run_id = state["history"], state["step"], state.get("run_id")
        run.seconds = state.get("epoch_seconds", [])
        run.best = state.get("best")
        run.start_epoch = run.resumed_from = state["epoch"] + 1
        if run.ddp.is_main:
            print(f"resuming from {self.checkpoint_path} after epoch {run.start_epoch} of {self.spec.train['epochs']}")

    def _train_epoch(self, run: "_Run", epoch: int) -> dict[str, float]:
        """One pass of P x K batches: the method's hooks, its loss, one optimiser step per batch; the epoch's row
        (mean loss and logs, lr, the method's epoch logs, its decisions scored against ground truth)."""
        cfg, model, method = self.spec.train, run.model, run.method
        torch.manual_seed(_epoch_seed(self.spec.seed, epoch))
        row: dict[str, float] = {"epoch": epoch + 1}
        trainable = method.trainable(epoch)
        model.set_frozen(trainable.frozen)
        row.update(method.on_epoch_start(run.context(epoch)))
        model.train()
        method.train()
        if trainable.freeze_batchnorm:
            for module in model.backbone.modules():
                if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                    module.eval()
        batches = epoch_batches(run.labels, cfg["batch"]["per_class"], run.batch_size, self.spec.seed, epoch)
        loss_sum, logs_sum = 0.0, {}
        bar = tqdm(batches, desc=f"{self.spec.method} epoch {epoch + 1}/{cfg['epochs']}", unit="step",
                   disable=not (self.runtime["progress"] and run.ddp.is_main), leave=False, mininterval=1.0)
        # this rank's rows of every batch (all of them on one process)
        inputs = run.pipeline.train_batches(self.train_set.images, [run.ddp.local_rows(b) for b in batches], epoch)
        for idx, x in zip(bar, inputs):
            batch = run.forward_batch(torch.from_numpy(idx), x, epoch, run.extra_rows(idx, epoch))
            loss, logs = method.loss(batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{self.spec.method}: loss is {loss.item()} at epoch {epoch + 1}, step "
                                         f"{run.step}; lower train.optimizer.lr or check the method's hyper-parameters")
            run.optimizer.zero_grad(set_to_none=True)
            run.scaler.scale(loss).backward()
            run.ddp.average_gradients(run.method_params)
            if cfg["optimizer"]["grad_clip_norm"] > 0:  # on the true gradients: unscaled first under AMP
                run.scaler.unscale_(run.optimizer)
                torch.nn.utils.clip_grad_norm_([p for g in run.optimizer.param_groups for p in g["params"]],
                                               cfg["optimizer"]["grad_clip_norm"])
            run.scaler.step(run.optimizer)
            run.scaler.update()
            run.scheduler.step()
            run.step += 1
            method.on_step_end(run.context(epoch), batch)
            loss_sum += loss.item()
            for k, v in logs.items():
                logs_sum[k] = logs_sum.get(k, 0.0) + float(v)
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        row["loss"] = loss_sum / len(batches)
        row.update({k: v / len(batches) for k, v in logs_sum.items()})
        row["lr"] = run.optimizer.param_groups[0]["lr"]
        row.update(method.on_epoch_end(run.context(epoch)))
        if self.truth is not None:
            row.update(score_decisions(method.decisions(), self.truth))
        return row

    def _monitor(self, run: "_Run", epoch: int, last: bool) -> dict[str, float]:
        """Validation P@1 (held-out training classes; keeps the best model when it selects) and the test-set
        curves (monitoring only: never selects)."""
        row: dict[str, float] = {}
        evaluate = self.spec.evaluate
        if self.val_set is not None:
            val = retrieval_metrics(run.embed_retrieval(self.val_set.images), self.val_set.labels, recall_at=(1,),
                                    nmi=False, include=MONITOR_METRICS, max_k=evaluate["max_k"],
                                    device=evaluate["device"])
            row.update({f"val_{k}": v for k, v in val.items()})
            selecting = self.spec.train["model_selection"] == "best_validation"
            if selecting:
                run.keep_if_best(epoch, val["precision_at_1"])
        test_emb = run.embed_retrieval(self.test_set.images)
        if last:
            run.last_test_embeddings = test_emb
        monitor = retrieval_metrics(test_emb, self.test_set.labels, recall_at=(1,), nmi=False, include=MONITOR_METRICS,
                                    max_k=evaluate["max_k"], device=evaluate["device"],
                                    query_mask=self.test_set.query_mask)
        row.update({f"test_{k}": v for k, v in monitor.items()})
        return row

    def _method_selects(self, run: "_Run", epoch: int, row: dict[str, float]) -> None:
        """A method that picks the reported epoch (:meth:`Method.selection_score`): keep the best-scoring model."""
        if not run.method.selects_epoch:
            return
        score = run.method.selection_score()
        if score is None:
            return
        row["selection_score"] = float(score)
        run.keep_if_best(epoch, float(score))

    def _record(self, run: "_Run", row: dict[str, float]) -> None:
        run.history.append(row)
        run.tracker.log_metrics({**{k: v for k, v in row.items() if k != "epoch"},
                                 "epoch_seconds": run.seconds[-1]}, step=row["epoch"])
        if run.ddp.is_main:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
                  + f" epoch_seconds={run.seconds[-1]:.1f}")

    def _save(self, run: "_Run", epoch: int) -> None:
        """The checkpoint a killed run resumes from (rank 0 writes it; every rank waits for it)."""
        state = {
            "fingerprint": run.fingerprint, "code": run.code, "runtime": run.runtime, "epoch": epoch, "step": run.step,
            "history": run.history,
            # waits for the MLflow run to be open (about 3 s of CPU, so after the first epoch it may not be
            # yet): a run killed before would otherwise resume as a second MLflow run
            "run_id": run.tracker.run_id, "epoch_seconds": run.seconds,
            "model": run.model.state_dict(), "method": run.method.state_dict(),
            "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(), "best": run.best,
            **({"scaler": run.scaler.state_dict()} if run.gpu["amp"] == "float16" else {}),
        }
        if run.ddp.is_main:
            io.write_with(self.checkpoint_path, lambda p: torch.save(state, p))
        run.ddp.barrier()  # no rank runs ahead of the checkpoint (a resume finds it whole)

    def _select(self, run: "_Run") -> None:
        """The reported model: the last epoch's, the best on the validation classes, or the epoch the method picked
        without validation data (never the test set)."""
        run.selected_epoch = self.spec.train["epochs"]
        selecting = self.spec.train["model_selection"] == "best_validation" or run.method.selects_epoch
        if selecting and run.best is not None:
            run.model.load_state_dict(run.best["model"])
            run.method.load_state_dict(run.best["method"])
            run.selected_epoch = run.best["epoch"]

    def _export(self, run: "_Run") -> TrainResult:
        """The selected model's embeddings, the method's per-row exports and its decisions' histograms."""
        # the last epoch's model is the final one unless validation chose another: its test pass is reused
        reuse = run.last_test_embeddings is not None and run.selected_epoch == self.spec.train["epochs"]
        test_emb = run.last_test_embeddings if reuse else run.embed_retrieval(self.test_set.images)
        train_emb = run.embed_retrieval(self.train_set.images)
        val_emb = run.embed_retrieval(self.val_set.images) if self.val_set is not None else None
        exports = {k: np.asarray(v) for k, v in run.method.export(run.context(self.spec.train["epochs"])).items()}
        for name, values in exports.items():
            if len(values) != len(run.labels):
                raise ValueError(f"{self.spec.method}.export(): {name!r} has {len(values)} values for "
                                 f"{len(run.labels)} training rows")
        histograms = decision_histograms(run.method.decisions(), self.truth) if self.truth is not None else {}
        return TrainResult(run.model, run.method, run.history, test_emb, train_emb, run.resumed_from,
                           run.tracker.run_id, selected_epoch=run.selected_epoch, val_embeddings=val_emb,
                           epoch_seconds=run.seconds, exports=exports,
                           device={**describe_device(run.device), "gpu_settings": run.gpu},
                           decision_histograms=histograms)


class _Run:
    """One fit's objects and the state its epochs change (what a checkpoint holds), with the passes over data
    the method's hooks call (:class:`~noisydml.methods.base.EpochContext`)."""

    def __init__(self, trainer: Trainer, *, device, gpu, ddp, tracker, pipeline, labels, batch_size, model, method,
                 optimizer, scaler, scheduler):
        self.trainer, self.device, self.gpu, self.ddp, self.tracker = trainer, device, gpu, ddp, tracker
        self.pipeline, self.labels, self.batch_size = pipeline, labels, batch_size
        self.model, self.method, self.optimizer, self.scaler, self.scheduler = model, method, optimizer, scaler, scheduler
        self.fingerprint = trainer.spec.fingerprint()
        self.code = code_fingerprint(*trainer.code, f"noisydml.methods.{trainer.spec.method}")
        #: the runtime keys that change what a run computes: a checkpoint made under others is not resumed
        self.runtime = tracked_runtime(trainer.runtime)
        self.history: list[dict[str, float]] = []
        self.seconds: list[float] = []
        self.start_epoch, self.step, self.run_id, self.resumed_from = 0, 0, None, None
        self.best: dict | None = None  # {"epoch", "score", "model", "method"} of the best validation epoch
        self.selected_epoch: int | None = None
        self.last_test_embeddings = None  # the last epoch's monitoring pass over the test set, reused as the final one
        self.forward = model.forward_with_features
        self.method_params = list(method.parameters())
        self.labels_t = torch.as_tensor(labels.copy())
        self.ids_t = torch.as_tensor(trainer.sample_ids.copy())
        self._embedded: dict[str, Any] = {}

    def wrap_for_ddp(self) -> None:
        """Under DDP the backbone and head average their gradients over ranks (forward_with_features is the
        forward). find_unused_parameters: a method may freeze the backbone or head in some epochs
        (Method.trainable)."""
        if not self.ddp.active:
            return
        device = self.device
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        self.forward = torch.nn.parallel.DistributedDataParallel(
            _ForwardWithFeatures(self.model), device_ids=device_ids, find_unused_parameters=True)

    def keep_if_best(self, epoch: int, score: float) -> None:
        """Keep this epoch's model and method state when ``score`` beats the best so far (ties: the earlier)."""
        if self.best is None or score > self.best["score"]:
            self.best = {"epoch": epoch + 1, "score": score, "model": copy.deepcopy(self.model.state_dict()),
                         "method": copy.deepcopy(self.method.state_dict())}

    def extra_rows(self, rows: np.ndarray, epoch: int) -> np.ndarray | None:
        """The rows the method asks to forward with the batch ``rows`` (:meth:`Method.extra_samples`), checked."""
        extra = self.method.extra_samples(rows, epoch, self.step)
        if extra is None:
            return None
        extra = np.asarray(extra)
        name, n = self.trainer.spec.method, len(self.labels)
        if extra.ndim != 1 or not np.issubdtype(extra.dtype, np.integer):
            raise ValueError(f"{name}.extra_samples(): expected a 1-D array of row indices, got shape "
                             f"{extra.shape} of {extra.dtype}")
        if len(extra) and (extra.min() < 0 or extra.max() >= n):
            raise ValueError(f"{name}.extra_samples(): row {int(extra.min() if extra.min() < 0 else extra.max())} "
                             f"is outside the training table (rows 0..{n - 1})")
        if len(extra) % self.ddp.world_size:
            raise ValueError(f"{name}.extra_samples(): {len(extra)} rows do not split evenly over "
                             f"{self.ddp.world_size} processes (runtime.processes)")
        return extra.astype(np.int64)

    def forward_batch(self, index: torch.Tensor, x: torch.Tensor, epoch: int, extra: np.ndarray | None) -> Batch:
        """The method's view of one batch: this rank's rows (and its share of the ``extra`` rows, in the same
        forward) gathered into the global batch."""
        gpu, device = self.gpu, self.device
        if extra is not None:
            rows = [self.ddp.local_rows(extra)]
            x_extra = next(iter(self.pipeline.train_batches(self.trainer.train_set.images, rows, epoch, "extra")))
            own = len(x)
            x = torch.cat([x, x_extra])
        if gpu["channels_last"]:
            x = x.to(memory_format=torch.channels_last)
        with autocast(device, gpu["amp"]):
            emb, feats = self.forward(x.to(device, non_blocking=True))
        own_inputs = x[:own] if extra is not None else x
        # the rows of the global batch this process holds (contiguous: Distributed.local_rows)
        held = slice(self.ddp.rank * len(own_inputs), (self.ddp.rank + 1) * len(own_inputs)) if self.ddp.active \
            else slice(0, len(own_inputs))

        def forward_network(net: torch.nn.Module | None = None, transform=None) -> tuple[torch.Tensor, torch.Tensor]:
            if net is None and self.ddp.active:
                raise ParamsError(f"runtime.processes: {self.ddp.world_size}, but {self.trainer.spec.method} forwards "
                                  "the model itself several times a step, which DDP's one reduction per backward "
                                  "does not allow; allowed: 1")
            inputs = own_inputs.to(device, non_blocking=True)
            if transform is not None:
                inputs = transform(inputs, held)
            with autocast(device, gpu["amp"]):
                e, f = (net or self.model).forward_with_features(inputs)
            return self.ddp.gather_rows(e.float()), self.ddp.gather_rows(f.float())

        extra_batch = None
        if extra is not None:
            extra_index = torch.from_numpy(extra)
            extra_batch = Batch(embeddings=self.ddp.gather_rows(emb[own:].float()),
                                features=self.ddp.gather_rows(feats[own:].float()),
                                labels=self.labels_t[extra_index].to(device), index=extra_index.to(device),
                                sample_id=self.ids_t[extra_index].to(device), step=self.step, epoch=epoch)
            emb, feats = emb[:own], feats[:own]
        # losses, memories and banks in float32 (mined similarities, softmaxes and margins in half lose too much);
        # under DDP the method gets the global batch, the same on every rank (``index`` is the global batch)
        emb, feats = self.ddp.gather_rows(emb.float()), self.ddp.gather_rows(feats.float())
        return Batch(embeddings=emb, features=feats, labels=self.labels_t[index].to(device),
                     index=index.to(device), sample_id=self.ids_t[index].to(device), step=self.step, epoch=epoch,
                     extra=extra_batch, forward_network=forward_network)

    def embed_all(self, images, features: bool = False, network: torch.nn.Module | None = None):
        """One pass over all rows through the model (or another ``network``, a method's peer); under DDP each rank
        embeds its shard, with rank 0's batch-norm statistics, and every rank gets all of them."""
        network = network or self.model
        self.ddp.broadcast_buffers(network)
        return self.ddp.embed(lambda x: embed(network, x, self.device, features=features, pipeline=self.pipeline),
                              images, features)

    def embed_retrieval(self, images) -> torch.Tensor:
        """What retrieval ranks with (:attr:`Method.retrieval`): the embeddings, or the L2-normalised backbone
        features (a classifier's penultimate layer)."""
        if self.method.retrieval == "features":
            return torch.nn.functional.normalize(self.embed_all(images, features=True)[1], dim=1)
        return self.embed_all(images)

    def embed_train(self, features: bool = False):
        """The training rows' embeddings, cached per (step, features): two hooks of one step share one pass."""
        key = (self.step, features)
        if self._embedded.get("key") != key:
            self._embedded.update(key=key, value=self.embed_all(self.trainer.train_set.images, features=features))
        return self._embedded["value"]

    def context(self, epoch: int) -> EpochContext:
        use_gpu = self.device.type == "cuda"
        return EpochContext(
            epoch=epoch, num_epochs=self.trainer.spec.train["epochs"], step=self.step, model=self.model,
            device=self.device, train_labels=self.labels, sample_ids=self.trainer.sample_ids,
            embed_train=self.embed_train,
            knn=lambda q, k, gallery=None: neighbours.knn(q, k, gallery, use_gpu=use_gpu),
            similarity_blocks=neighbours.similarity_blocks, inputs=self.trainer.inputs,
            embed_train_network=lambda net: self.embed_all(self.trainer.train_set.images, True, network=net),
        )
