"""The trainer: one loop for every method.

A :class:`Trainer` runs a :class:`~noisydml.engine.job.Job` with a strategy (:class:`~noisydml.engine.strategy.Strategy`:
the device, AMP, channels-last, one process or DDP) and callbacks (:mod:`noisydml.engine.callbacks`: checkpoint and
resume, tracking, the judge, model selection, the timeline). Batches are P classes x K samples
(:mod:`noisydml.engine.sampling`, re-seeded every epoch so a resumed run draws the same batches as an uninterrupted
one). The model is backbone + linear head + L2 normalisation; the method (:mod:`noisydml.methods.base`) turns a
:class:`~noisydml.methods.base.Batch` into a loss. After every epoch the judge scores the method's decisions against
ground truth the method never sees and a checkpoint is written; a run started again with the same configuration
*and code* continues from it, so killing ``dvc repro`` loses at most one epoch.

Under ``torchrun`` (``runtime.processes`` > 1) one run trains on several processes with PyTorch's DDP: each rank
forwards its share of the batch, the method sees the gathered global batch, rank 0 writes checkpoints and records
(:mod:`noisydml.engine.distributed`). A one-process run takes none of those paths.

Test-set metrics logged during training are monitoring for the curves only: the reported model is the last
epoch's, or the best on held-out *training* classes, never the best on the test set.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tqdm import tqdm

from noisydml.data.images import InputPipeline, image_channels
from noisydml.engine.callbacks import Callback, default_callbacks
from noisydml.engine.job import Job
from noisydml.engine.optim import build_optimizer, lr_factor
from noisydml.engine.sampling import epoch_batches, epoch_seed, steps_per_epoch
from noisydml.engine.state import FitServices, FitState
from noisydml.engine.strategy import Strategy
from noisydml.engine.types import TrainResult
from noisydml.evaluation.retrieval import retrieval_metrics
from noisydml.methods import build_method
from noisydml.methods.base import MethodSetup
from noisydml.models import build_model, load_backbone_weights
from noisydml.schema import ParamsError

MONITOR_METRICS = ("precision_at_1", "mean_average_precision_at_r")


class Trainer:
    """Fits one :class:`~noisydml.engine.job.Job`; see the module docstring. ``strategy``: built from the job's
    runtime unless given; ``callbacks``: :func:`~noisydml.engine.callbacks.default_callbacks` unless given."""

    def __init__(self, job: Job, strategy: Strategy | None = None, callbacks: list[Callback] | None = None):
        self.job = job
        self.strategy = strategy
        self.callbacks = default_callbacks() if callbacks is None else callbacks

    def _call(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    def fit(self) -> TrainResult:
        """Build, then per epoch: train, monitor, record; then select and export. The order of every random draw
        is that of one loop, so a resumed run reproduces an uninterrupted one bit for bit."""
        fit = self._build()
        self._call("on_fit_start", fit)
        self.strategy.wrap(fit.model)
        fit.method.on_train_start(fit.context(fit.start_epoch), restored=fit.resumed_from is not None)
        self._call("on_train_start", fit)
        cfg = self.job.spec.train
        for epoch in range(fit.start_epoch, cfg["epochs"]):
            t0 = time.perf_counter()
            row = self._train_epoch(fit, epoch)
            fit.seconds.append(time.perf_counter() - t0)
            self._call("on_train_epoch_end", fit, epoch, row)
            last = epoch + 1 == cfg["epochs"]
            if last or (cfg["eval_every"] and (epoch + 1) % cfg["eval_every"] == 0):
                t0 = time.perf_counter()
                row.update(self._monitor(fit, last))
                if last:
                    fit.final_embedding_seconds += time.perf_counter() - t0
            self._call("on_validation_end", fit, epoch, row)
            fit.history.append(row)
            self._call("on_epoch_end", fit, epoch, row)
        self._call("on_train_end", fit)
        t0 = time.perf_counter()
        result = self._export(fit)
        fit.final_embedding_seconds += time.perf_counter() - t0
        self._call("on_fit_end", fit, result)
        return result

    def _build(self) -> FitState:
        """Seeds, input pipeline, model (pretrained or upstream weights), method, optimiser, schedule."""
        job, cfg = self.job, self.job.spec.train
        self.strategy = strategy = self.strategy or Strategy(job.runtime)
        labels = np.asarray(job.train_set.labels, dtype=np.int64)
        strategy.ddp.check_batch(job.batch_size)
        torch.manual_seed(job.spec.seed)
        pipeline = InputPipeline.from_params(cfg, job.runtime, job.spec.seed, strategy.device)
        in_channels = image_channels(job.train_set.images)

        def build_network() -> torch.nn.Module:
            """A network of this run's architecture and starting weights: the model, and a method's peer."""
            net = build_model(cfg, in_channels=in_channels)
            if job.backbone_state is not None:
                load_backbone_weights(net.backbone, job.backbone_state, cfg["pretrained"])
            return strategy.place(net)

        model = strategy.prepare_model(build_network())
        services = FitServices(build_network)
        method = build_method(
            job.spec.method,
            MethodSetup(hparams=job.spec.method_hparams, num_classes=int(labels.max()) + 1,
                        embedding_dim=cfg["embedding_dim"], dataset_size=len(labels), train_labels=labels,
                        seed=job.spec.seed, feature_dim=int(getattr(model.backbone, "out_dim", 0)),
                        sample_ids=job.sample_ids, inputs=job.inputs, services=services),
        ).to(strategy.device)
        self._check_method(method)
        if job.init_state is not None:
            model.load_state_dict(job.init_state["model"])
            if job.init_state.get("method") is not None:
                method.load_state_dict(job.init_state["method"])
        optimizer = build_optimizer(model, method, cfg["optimizer"])
        # float16 only (bfloat16 has float32's range): disabled, scale() and step() are the identity and
        # optimizer.step()
        scaler = torch.amp.GradScaler("cuda", enabled=strategy.gpu["amp"] == "float16")
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_factor(cfg["schedule"], cfg["epochs"], steps_per_epoch(len(labels), job.batch_size)))
        services.fit = FitState(job, strategy, pipeline=pipeline, labels=labels, model=model, method=method,
                                optimizer=optimizer, scaler=scaler, scheduler=scheduler)
        return services.fit

    def _check_method(self, method) -> None:
        """What a method declares about itself against the run's params."""
        name, selection = self.job.spec.method, self.job.spec.train["model_selection"]
        if method.retrieval not in ("embeddings", "features"):
            raise ValueError(f"{name}.retrieval is {method.retrieval!r}; allowed: embeddings, features")
        if method.selects_epoch and selection != "last":
            raise ParamsError(f"train.model_selection: {selection!r}, but {name} selects the reported epoch itself "
                              "(without validation data); allowed: last")

    def _train_epoch(self, fit: FitState, epoch: int) -> dict[str, float]:
        """One pass of P x K batches: the method's hooks, its loss, one optimiser step per batch; the epoch's row
        (mean loss and logs, lr, the method's epoch logs)."""
        job, cfg, model, method, ddp = self.job, self.job.spec.train, fit.model, fit.method, self.strategy.ddp
        torch.manual_seed(epoch_seed(job.spec.seed, epoch))
        row: dict[str, float] = {"epoch": epoch + 1}
        trainable = method.trainable(epoch)
        model.set_frozen(trainable.frozen)
        row.update(method.on_epoch_start(fit.context(epoch)))
        model.train()
        method.train()
        if trainable.freeze_batchnorm:
            for module in model.backbone.modules():
                if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                    module.eval()
        batches = epoch_batches(fit.labels, cfg["batch"]["per_class"], job.batch_size, job.spec.seed, epoch)
        loss_sum, logs_sum, checks = 0.0, {}, []
        bar = tqdm(batches, desc=f"{job.spec.method} epoch {epoch + 1}/{cfg['epochs']}", unit="step",
                   disable=not (job.runtime["progress"] and ddp.is_main), leave=False, mininterval=1.0)
        # this rank's rows of every batch (all of them on one process)
        inputs = fit.pipeline.train_batches(job.train_set.images, [ddp.local_rows(b) for b in batches], epoch)
        for idx, x in zip(bar, inputs):
            batch = fit.batch(torch.from_numpy(idx), x, epoch, fit.extra_rows(idx, epoch))
            loss, logs = method.loss(batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{job.spec.method}: loss is {loss.item()} at epoch {epoch + 1}, step "
                                         f"{fit.step}; lower train.optimizer.lr or check the method's hyper-parameters")
            self._step(fit, loss)
            method.on_step_end(fit.context(epoch), batch)
            if cfg["test_check_every_steps"] and fit.step % cfg["test_check_every_steps"] == 0:
                checks.append(self._test_check(fit))
            loss_sum += loss.item()
            for k, v in logs.items():
                logs_sum[k] = logs_sum.get(k, 0.0) + float(v)
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        row["loss"] = loss_sum / len(batches)
        row.update({k: v / len(batches) for k, v in logs_sum.items()})
        row["lr"] = fit.optimizer.param_groups[0]["lr"]
        if cfg["test_check_every_steps"]:  # the epoch's best check (none fell in it: NaN)
            row["test_check_precision_at_1"] = max(checks, default=float("nan"))
        row.update(method.on_epoch_end(fit.context(epoch)))
        return row

    def _step(self, fit: FitState, loss: torch.Tensor) -> None:
        """Backward (scaled under float16 AMP), the method's gradients averaged over ranks, clipping on the true
        gradients, one optimiser and schedule step."""
        clip = self.job.spec.train["optimizer"]["grad_clip_norm"]
        fit.optimizer.zero_grad(set_to_none=True)
        fit.scaler.scale(loss).backward()
        self.strategy.ddp.average_gradients(fit.method_params)
        if clip > 0:  # on the true gradients: unscaled first under AMP
            fit.scaler.unscale_(fit.optimizer)
            torch.nn.utils.clip_grad_norm_([p for g in fit.optimizer.param_groups for p in g["params"]], clip)
        fit.scaler.step(fit.optimizer)
        fit.scaler.update()
        fit.scheduler.step()
        fit.step += 1

    def _monitor(self, fit: FitState, last: bool) -> dict[str, float]:
        """Validation P@1 (held-out training classes: what model selection may look at) and the test-set curves
        (monitoring only: never selects)."""
        row: dict[str, float] = {}
        job, evaluate = self.job, self.job.spec.evaluate
        settings = dict(recall_at=(1,), nmi=False, include=MONITOR_METRICS, max_k=job.spec.train["monitor_max_k"],
                        device=evaluate["device"])
        if job.val_set is not None:
            val = retrieval_metrics(fit.embed_retrieval(job.val_set.images), job.val_set.labels, **settings)
            row.update({f"val_{k}": v for k, v in val.items()})
        test_emb = fit.embed_retrieval(job.test_set.images)
        if last:
            fit.last_test_embeddings = test_emb
        monitor = retrieval_metrics(test_emb, job.test_set.labels, query_mask=job.test_set.query_mask, **settings)
        row.update({f"test_{k}": v for k, v in monitor.items()})
        return row

    def _test_check(self, fit: FitState) -> float:
        """Test P@1 between two steps (``train.test_check_every_steps``): the PRISM authors' code checks every 100
        iterations and reports its best. Only the test-selected figure reads it; it selects nothing, and the
        embedding pass restores every module's mode and draws no random number, so the run trains as without it."""
        job, evaluate = self.job, self.job.spec.evaluate
        metrics = retrieval_metrics(fit.embed_retrieval(job.test_set.images), job.test_set.labels,
                                    query_mask=job.test_set.query_mask, recall_at=(1,), nmi=False,
                                    include=("precision_at_1",), max_k=job.spec.train["monitor_max_k"],
                                    device=evaluate["device"])
        return float(metrics["precision_at_1"])

    def _export(self, fit: FitState) -> TrainResult:
        """The selected model's embeddings and the method's per-row exports."""
        job = self.job
        # the last epoch's model is the final one unless selection chose another: its test pass is reused
        reuse = fit.last_test_embeddings is not None and fit.selected_epoch == job.spec.train["epochs"]
        test_emb = fit.last_test_embeddings if reuse else fit.embed_retrieval(job.test_set.images)
        train_emb = fit.embed_retrieval(job.train_set.images)
        val_emb = fit.embed_retrieval(job.val_set.images) if job.val_set is not None else None
        exports = {k: np.asarray(v) for k, v in fit.method.export(fit.context(job.spec.train["epochs"])).items()}
        for name, values in exports.items():
            if len(values) != len(fit.labels):
                raise ValueError(f"{job.spec.method}.export(): {name!r} has {len(values)} values for "
                                 f"{len(fit.labels)} training rows")
        return TrainResult(fit.model, fit.method, fit.history, test_emb, train_emb, fit.resumed_from,
                           fit.tracker.run_id, selected_epoch=fit.selected_epoch, val_embeddings=val_emb,
                           epoch_seconds=fit.seconds, exports=exports, device=self.strategy.describe())
