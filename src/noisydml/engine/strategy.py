"""How a fit runs on its hardware (:class:`Strategy`): the device and its switches (AMP, channels-last, cuDNN,
determinism), and one process or DDP (each rank forwards its rows, the method sees the gathered global batch,
SyncBN, barriers, broadcasts: :mod:`noisydml.engine.distributed`). One class serves both: with one process every
collective is the identity, so a one-process run takes none of DDP's paths."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from noisydml.engine import distributed
from noisydml.schema import ParamsError


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


class _ForwardWithFeatures(torch.nn.Module):
    """The model with ``forward_with_features`` as its forward: the module DDP wraps (DDP hooks ``forward``)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        return self.model.forward_with_features(x)



class Strategy:
    """The device, its switches as they took effect (:attr:`gpu`, recorded in run.json) and this process's place
    in a DDP run (:attr:`ddp`). Built once per fit, before any random draw."""

    def __init__(self, runtime: dict):
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
        self.device = device
        self.gpu = gpu_settings(runtime, device)
        self.ddp = distributed.current()
        self.sync_batchnorm = bool(runtime["sync_batchnorm"])
        self._forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def is_main(self) -> bool:
        return self.ddp.is_main

    def place(self, network: torch.nn.Module) -> torch.nn.Module:
        """``network`` on the device, in channels-last memory format where that took effect."""
        network = network.to(self.device)
        return network.to(memory_format=torch.channels_last) if self.gpu["channels_last"] else network

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Under DDP: SyncBatchNorm where asked for and possible (CUDA), recorded in :attr:`gpu`."""
        if not self.ddp.active:
            return model
        self.gpu["distributed"] = self.ddp.describe()
        self.gpu["distributed"]["sync_batchnorm"] = self.sync_batchnorm and self.device.type == "cuda"
        if self.gpu["distributed"]["sync_batchnorm"]:
            return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if self.sync_batchnorm and self.ddp.is_main:
            print("runtime.sync_batchnorm: PyTorch's SyncBatchNorm needs CUDA; batch-norm statistics are per rank")
        return model

    def wrap(self, model: torch.nn.Module) -> None:
        """The training forward: ``model.forward_with_features``; under DDP wrapped so the backbone and head average
        their gradients over ranks. find_unused_parameters: a method may freeze the backbone or head in some epochs
        (Method.trainable)."""
        self._forward = model.forward_with_features
        if not self.ddp.active:
            return
        device = self.device
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else None
        self._forward = torch.nn.parallel.DistributedDataParallel(
            _ForwardWithFeatures(model), device_ids=device_ids, find_unused_parameters=True)

    def memory_format(self, inputs: torch.Tensor) -> torch.Tensor:
        """Network inputs in channels-last memory format where that took effect."""
        return inputs.to(memory_format=torch.channels_last) if self.gpu["channels_last"] else inputs

    def forward(self, inputs: torch.Tensor, network: torch.nn.Module | None = None):
        """``(embeddings, features)`` of this rank's ``inputs`` through the wrapped model (or ``network``), in
        training mode, under the run's autocast."""
        with autocast(self.device, self.gpu["amp"]):
            forward = self._forward if network is None else network.forward_with_features
            return forward(inputs.to(self.device, non_blocking=True))

    def check_forwards_again(self, method: str) -> None:
        """A method forwarding the model itself a second time in a step: one process only."""
        if self.ddp.active:
            raise ParamsError(f"runtime.processes: {self.ddp.world_size}, but {method} forwards the model itself "
                              "several times a step, which DDP's one reduction per backward does not allow; allowed: 1")

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's rows, in float32, gathered into the global batch's (the identity on one process)."""
        return self.ddp.gather_rows(rows.float())

    def held_rows(self, count: int) -> slice:
        """The rows of the global batch this process holds, ``count`` of them (contiguous: Distributed.local_rows)."""
        return slice(self.ddp.rank * count, (self.ddp.rank + 1) * count) if self.ddp.active else slice(0, count)

    def describe(self) -> dict[str, Any]:
        """The resolved device, the library versions and the switches as they took effect (run.json)."""
        return {**describe_device(self.device), "gpu_settings": self.gpu}
