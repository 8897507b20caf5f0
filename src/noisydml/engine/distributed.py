"""One run on several processes with PyTorch's DistributedDataParallel (``runtime.processes``, ``torchrun``).

How a run is split (all of it ours; the papers train on one GPU):

- **Batches.** Every rank draws the same P x K batch (the sampler is seeded by seed and epoch) and takes its
  own contiguous ``B / W`` rows of it: no row is on two ranks, and whole classes stay together when K divides
  ``B / W``.
- **The global batch.** After the forward pass the trainer gathers the embeddings and backbone features of all
  ranks, in rank order, with :class:`_GatherRows` (an all-gather whose backward sums the gradients of every
  rank's copy, then keeps the rank's own rows). Every rank then hands the method the *same* batch, in the same
  row order as a one-process run with the same global batch: pair losses and miners see all ``B`` rows, and
  memories, banks and PRISM's centres, updated from that batch, stay identical on every rank (gathered, never
  per-rank copies).
- **Gradients.** Each rank's loss is the global loss; its gradient reaches the model only through the rank's
  own rows, multiplied by ``W`` by the gather's backward, and DDP averages over ranks: the model gets exactly
  the one-process gradient. A method's own parameters (proxies) get the full gradient on every rank; it is
  averaged over ranks (:meth:`Distributed.average_gradients`) so they stay identical bit for bit.
- **Embedding passes** (evaluation, ``embed_train``): each rank embeds a contiguous shard; the shards are
  gathered before any metric, kNN or clustering, so every rank holds all embeddings.

Why not pytorch-metric-learning's ``DistributedLossWrapper``: it wraps one pml loss, while a method here is
more (selection, memories, per-sample state); it puts each rank's own rows first, so the batch -- and a memory
filled from it -- would differ between ranks; and it scales the loss by ``W``, which scales a loss's own
parameters' gradients ``W``-fold.

Batch-norm statistics are per rank unless ``runtime.sync_batchnorm`` converts the model to PyTorch's
``SyncBatchNorm``, which runs on CUDA only; on the CPU (gloo) a run with batch-norm in training mode normalises
each rank's ``B / W`` rows (with ``train.frozen_bn`` it does not depend on the split).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from noisydml.schema import ParamsError

#: Environment variable torchrun sets in every process it starts.
WORLD_SIZE_ENV = "WORLD_SIZE"


class _GatherRows(torch.autograd.Function):
    """All-gather of equal-sized row blocks, concatenated in rank order. Backward: every rank's loss used every
    block, so the gradient of this rank's block is the sum over ranks of the gradients of its copy."""

    @staticmethod
    def forward(ctx, block: torch.Tensor) -> torch.Tensor:
        ctx.rows, ctx.rank = block.shape[0], dist.get_rank()
        parts = [torch.empty_like(block) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, block.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


@dataclass(frozen=True)
class Distributed:
    """This process's place in the run: rank ``rank`` of ``world_size`` (1: no process group, every method is
    the identity, so a one-process run does exactly what it did before DDP existed)."""

    rank: int = 0
    world_size: int = 1
    backend: str | None = None

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, outputs, progress bars and MLflow records."""
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        return {"processes": self.world_size, "backend": self.backend}

    # ------------------------------------------------------------------ batches

    def check_batch(self, batch_size: int) -> None:
        if self.active and batch_size % self.world_size:
            raise ParamsError(f"train.batch: a batch of {batch_size} rows does not split over runtime.processes = "
                              f"{self.world_size} ranks; allowed: batch.classes x batch.per_class a multiple of "
                              f"{self.world_size}")

    def local_rows(self, batch: np.ndarray) -> np.ndarray:
        """This rank's contiguous share of a global batch."""
        if not self.active:
            return batch
        size = len(batch) // self.world_size
        return batch[self.rank * size : (self.rank + 1) * size]

    def gather_rows(self, block: torch.Tensor) -> torch.Tensor:
        """Every rank's equal-sized ``block``, in rank order; differentiable (see :class:`_GatherRows`)."""
        return _GatherRows.apply(block) if self.active else block

    # ------------------------------------------------------------------ embedding passes

    def shard(self, n: int) -> slice:
        """This rank's contiguous rows of ``n`` (the last shards may be shorter or empty)."""
        if not self.active:
            return slice(0, n)
        size = -(-n // self.world_size)
        return slice(min(n, self.rank * size), min(n, (self.rank + 1) * size))

    def gather_shards(self, part: torch.Tensor, n: int) -> torch.Tensor:
        """The ``n`` rows whose shards (:meth:`shard`) the ranks hold, in row order, on every rank."""
        if not self.active:
            return part
        size = -(-n // self.world_size)
        # NCCL moves CUDA tensors only (embedding passes return CPU tensors); gloo moves both
        via = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else part.device
        padded = torch.zeros((size, *part.shape[1:]), dtype=part.dtype, device=via)
        padded[: len(part)] = part.to(via)
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat(parts)[:n].to(part.device)

    def embed(self, embed_rows: Callable[[Any], Any], images: Any, features: bool = False):
        """``embed_rows(images)`` over all rows: each rank embeds its shard, every rank gets all of them."""
        if not self.active:
            return embed_rows(images)
        n = len(images)
        rows = self.shard(n)
        if rows.start == rows.stop and n:
            # an empty shard (rows run out before the last rank): embed one row and keep none of it, so this rank
            # gathers a (0, D) block of the others' shape and dtype rather than a shapeless empty tensor
            out = embed_rows(images[:1])
            out = (out[0][:0], out[1][:0]) if features else out[:0]
        else:
            out = embed_rows(images[rows])
        if features:
            return self.gather_shards(out[0], n), self.gather_shards(out[1], n)
        return self.gather_shards(out, n)

    # ------------------------------------------------------------------ state

    def average_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Average the gradients of parameters outside DDP (a method's proxies) so every rank steps alike."""
        if not self.active:
            return
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(self.world_size)

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Rank 0's buffers (batch-norm running statistics) on every rank. Without SyncBatchNorm each rank's
        training forward updates them from its own shard; DDP re-broadcasts rank 0's at its next forward, but an
        embedding pass in between would embed each shard with its own rank's statistics, so the gathered
        embeddings would match no single model, and a resumed run (every rank restored from rank 0's
        checkpoint) would embed differently from an uninterrupted one."""
        if self.active:
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def current() -> Distributed:
    """The process group this process belongs to (none: a one-process run)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return Distributed(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
    return Distributed()


def launched_by_torchrun() -> bool:
    return int(os.environ.get(WORLD_SIZE_ENV, "1")) > 1


def init_from_environment(device_name: str) -> Distributed:
    """Join the process group torchrun set up (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_*``): NCCL when
    the run trains on CUDA, gloo on the CPU. Each process takes the GPU of its local rank."""
    if not launched_by_torchrun():
        return Distributed()
    if not dist.is_initialized():
        cuda = device_name != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    return current()


def relaunch_under_torchrun(processes: int, argv: Sequence[str]) -> int:
    """Run this stage again as ``processes`` processes on this machine (``torchrun --standalone``) and return
    their exit status; called when ``runtime.processes`` > 1 and the stage was not started by torchrun."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               *argv]
    print(f"runtime.processes = {processes}: {' '.join(command)}", flush=True)
    from noisydml.processes import run_group

    # torchrun and its ranks as a group of their own: stopped whole when this stage is stopped or killed by its PID
    # (they would go on holding the GPUs), as a Ctrl-C at a terminal stops them
    return run_group(command)
