"""One fit's objects and the state its epochs change (:class:`FitState`: what a checkpoint holds), with the passes
over data that the loop and the method's hooks call: a training batch as the method sees it (its extra rows in the
same forward), embeddings of whole sets, the epoch context (:class:`~noisydml.methods.base.EpochContext`)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch

from noisydml import neighbours
from noisydml.data.images import InputPipeline
from noisydml.engine.embedding import embed
from noisydml.engine.job import Job
from noisydml.engine.strategy import Strategy
from noisydml.engine.types import NullTracker
from noisydml.methods.base import Batch, EpochContext, ExtraRows, MethodServices
from noisydml.runtime import tracked_runtime


class FitState:
    """The built fit (model, method, optimiser, schedule, scaler, input pipeline, tracker of this rank) and its
    changing state: history, step, epoch to start from, best epoch, tracking run id."""

    def __init__(self, job: Job, strategy: Strategy, *, pipeline: InputPipeline, labels: np.ndarray, model, method,
                 optimizer, scaler, scheduler):
        self.job, self.strategy, self.pipeline, self.labels = job, strategy, pipeline, labels
        # ranks other than 0 record nothing: rank 0 holds the tracking run and writes the checkpoint
        self.tracker = job.tracker if strategy.is_main else NullTracker()
        self.model, self.method, self.optimizer, self.scaler, self.scheduler = model, method, optimizer, scaler, scheduler
        self.fingerprint = job.spec.fingerprint()
        #: the runtime keys that change what a fit computes: a checkpoint made under others is not resumed
        self.runtime = tracked_runtime(job.runtime)
        self.history: list[dict[str, float]] = []
        self.seconds: list[float] = []
        self.start_epoch, self.step, self.run_id, self.resumed_from = 0, 0, None, None
        self.best: dict | None = None  # {"epoch", "score", "model", "method"} of the best epoch so far
        self.selected_epoch: int | None = None
        self.last_test_embeddings = None  # the last epoch's monitoring pass over the test set, reused as the final one
        self.final_embedding_seconds = 0.0  # the passes after the last step (Timeline)
        self.method_params = list(method.parameters())
        self.labels_t = torch.as_tensor(labels.copy())
        self.ids_t = torch.as_tensor(job.sample_ids.copy())
        self._embedded: dict[str, Any] = {}
        self._step_inputs: tuple | None = None  # (step, this rank's inputs, their rows of the global batch)

    def keep_if_best(self, epoch: int, score: float) -> None:
        """Keep this epoch's model and method state when ``score`` beats the best so far (ties: the earlier)."""
        if self.best is None or score > self.best["score"]:
            self.best = {"epoch": epoch + 1, "score": score, "model": copy.deepcopy(self.model.state_dict()),
                         "method": copy.deepcopy(self.method.state_dict())}

    # ------------------------------------------------------------------ a training batch

    def extra_rows(self, rows: np.ndarray, epoch: int) -> ExtraRows | None:
        """The rows the method asks to forward with the batch ``rows`` (:meth:`Method.extra_samples`), checked."""
        request = self.method.extra_samples(rows, epoch, self.step)
        if request is None:
            return None
        if not isinstance(request, ExtraRows):
            request = ExtraRows(request)
        extra = np.asarray(request.rows)
        name, n, world = self.job.spec.method, len(self.labels), self.strategy.ddp.world_size
        if extra.ndim != 1 or not np.issubdtype(extra.dtype, np.integer):
            raise ValueError(f"{name}.extra_samples(): expected a 1-D array of row indices, got shape "
                             f"{extra.shape} of {extra.dtype}")
        if len(extra) and (extra.min() < 0 or extra.max() >= n):
            raise ValueError(f"{name}.extra_samples(): row {int(extra.min() if extra.min() < 0 else extra.max())} "
                             f"is outside the training table (rows 0..{n - 1})")
        if len(extra) % world:
            raise ValueError(f"{name}.extra_samples(): {len(extra)} rows do not split evenly over {world} processes "
                             "(runtime.processes)")
        return ExtraRows(extra.astype(np.int64), request.drawn)

    def batch(self, index: torch.Tensor, x: torch.Tensor, epoch: int, extra: ExtraRows | None) -> Batch:
        """The method's view of one batch: this rank's rows (and its share of the ``extra`` rows, in the same
        forward) gathered into the global batch; the extra rows come back in ``batch.extra`` with their request."""
        strategy, device = self.strategy, self.strategy.device
        own = len(x)
        if extra is not None:
            rows = [strategy.ddp.local_rows(extra.rows)]
            x = torch.cat([x, next(iter(self.pipeline.train_batches(self.job.train_set.images, rows, epoch, "extra")))])
        x = strategy.memory_format(x)
        emb, feats = strategy.forward(x)
        # what MethodServices.forward sends through another network in this step
        self._step_inputs = (self.step, x[:own], strategy.held_rows(own))
        extra_batch = None
        if extra is not None:
            extra_index = torch.from_numpy(extra.rows)
            extra_batch = Batch(embeddings=strategy.gather(emb[own:]), features=strategy.gather(feats[own:]),
                                labels=self.labels_t[extra_index].to(device), index=extra_index.to(device),
                                sample_id=self.ids_t[extra_index].to(device), step=self.step, epoch=epoch,
                                request=extra)
            emb, feats = emb[:own], feats[:own]
        # losses, memories and banks in float32 (mined similarities, softmaxes and margins in half lose too much);
        # under DDP the method gets the global batch, the same on every rank (``index`` is the global batch)
        return Batch(embeddings=strategy.gather(emb), features=strategy.gather(feats),
                     labels=self.labels_t[index].to(device), index=index.to(device),
                     sample_id=self.ids_t[index].to(device), step=self.step, epoch=epoch, extra=extra_batch)

    def forward_rows(self, batch: Batch, net: torch.nn.Module | None = None,
                     transform=None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`MethodServices.forward`: this rank's rows of the current step's batch through ``net`` (or the
        model again, one process only), after ``transform(inputs, held)``, gathered."""
        step, own_inputs, held = self._step_inputs
        if batch.step != step:
            raise RuntimeError(f"{self.job.spec.method}: MethodServices.forward got a batch of step {batch.step}; only "
                               f"the current step's ({step}) inputs are at hand")
        if net is None:
            self.strategy.check_forwards_again(self.job.spec.method)
        inputs = own_inputs.to(self.strategy.device, non_blocking=True)
        if transform is not None:
            inputs = transform(inputs, held)
        e, f = self.strategy.forward(inputs, net or self.model)
        return self.strategy.gather(e), self.strategy.gather(f)

    # ------------------------------------------------------------------ passes over whole sets

    def embed_all(self, images, features: bool = False, network: torch.nn.Module | None = None):
        """One pass over all rows through the model (or another ``network``, a method's peer); under DDP each rank
        embeds its shard, with rank 0's batch-norm statistics, and every rank gets all of them."""
        network = network or self.model
        ddp, device = self.strategy.ddp, self.strategy.device
        ddp.broadcast_buffers(network)
        return ddp.embed(lambda x: embed(network, x, device, features=features, pipeline=self.pipeline),
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
            self._embedded.update(key=key, value=self.embed_all(self.job.train_set.images, features=features))
        return self._embedded["value"]

    def context(self, epoch: int) -> EpochContext:
        use_gpu = self.strategy.device.type == "cuda"
        return EpochContext(
            epoch=epoch, num_epochs=self.job.spec.train["epochs"], step=self.step, model=self.model,
            device=self.strategy.device, train_labels=self.labels, sample_ids=self.job.sample_ids,
            embed_train=self.embed_train,
            knn=lambda q, k, gallery=None: neighbours.knn(q, k, gallery, use_gpu=use_gpu),
            similarity_blocks=neighbours.similarity_blocks, inputs=self.job.inputs,
        )


class FitServices(MethodServices):
    """The engine's :class:`~noisydml.methods.base.MethodServices`: networks built as the run's model is, and the
    passes of the fit (:class:`FitState`, attached once it is built) through them."""

    def __init__(self, build_network: Callable[[], torch.nn.Module]):
        self._build_network = build_network
        self.fit: FitState | None = None

    def build_network(self) -> torch.nn.Module:
        return self._build_network()

    def forward(self, batch: Batch, network: torch.nn.Module | None = None, transform=None):
        return self.fit.forward_rows(batch, network, transform)

    def embed_train(self, network: torch.nn.Module):
        return self.fit.embed_all(self.fit.job.train_set.images, True, network=network)
