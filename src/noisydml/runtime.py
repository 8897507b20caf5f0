"""The ``runtime`` section of params.yaml: how a run executes.

Some of its keys change what a run computes (:data:`TRACKED_RUNTIME`): every stage that trains declares them as
DVC params, and a killed run resumes only under the same values. The others (progress bars, worker processes,
where to run, cuDNN's autotuner) change how fast it runs, not its results: untracked, so changing them re-runs
nothing. Its own module (no torch, nothing of the package but the schema machinery) so the engine reads its
defaults from the schema itself, as the params loader does.
"""

from __future__ import annotations

import os
from typing import Any

from noisydml.schema import Field, check_section

#: Set by a launcher that runs a stage inside a process it keeps (noisydml.tools.launch): when it started the
#: stage (seconds since the epoch); the stage's timing record starts there instead of at the process's start.
STAGE_STARTED = "NOISYDML_STAGE_STARTED"

#: ``runtime.amp``: the forward's precision on CUDA: ``float32`` (no autocast), or autocast to ``float16`` /
#: ``bfloat16``. Not ``off``: DVC (YAML 1.2) writes it unquoted, and a YAML 1.1 reader (PyYAML) then reads false.
AMP_CHOICES = ("float32", "float16", "bfloat16")

RUNTIME_SCHEMA = {
    "device": Field(str, "auto", choices=("auto", "cpu", "cuda"),
                    help="auto = CUDA when present (says so when it falls back to the CPU)"),
    "numerics": Field(str, "portable", choices=("portable", "native"),
                      help="ours: portable = every numeric library pinned to its x86-64 AVX2 code path and "
                           "runtime.threads threads (the same bits on the same host; other x86-64 CPUs differ less, "
                           "within CI's measured tolerance: README \"Reproducibility\"); native = each library's "
                           "fastest path on this host (noisydml.numerics)"),
    "threads": Field(int, 2, min=0, help="CPU threads of every thread pool (torch, MKL, OpenBLAS, faiss); 0 = the "
                                         "libraries' default, the core count (native only: it changes the bits)"),
    "progress": Field(bool, True, help="progress bars"),
    "deterministic": Field(bool, False, help="torch.use_deterministic_algorithms (GPU runs bit-exact, slower)"),
    "prepare_workers": Field(int, 0, min=0, help="processes decoding and checking image files when preparing a "
                                                  "dataset (0 = one per CPU core)"),
    "loader_workers": Field(int, 0, min=-1, help="DataLoader worker processes decoding file-stored images (0 = in "
                                                  "the training process; -1 = one per CPU core but one, counted "
                                                  "where the run starts); results do not depend on it"),
    "amp": Field(str, "float32", choices=AMP_CHOICES,
                 help="CUDA: the network's forward in float32, or under autocast to float16 (with gradient scaling) "
                      "or bfloat16 (no scaling needed); losses stay float32; float32 on the CPU"),
    "channels_last": Field(bool, False, help="CUDA: channels-last memory format for the network; off on CPU"),
    "cudnn_benchmark": Field(bool, False, help="CUDA: cuDNN autotuner (off when deterministic); off on CPU"),
    "processes": Field(int, 1, min=1, help="ours: processes training one run with DDP (torchrun; NCCL on CUDA, one "
                                           "GPU each, gloo on the CPU); the batch is split over them"),
    "sync_batchnorm": Field(bool, True, help="ours: with processes > 1 on CUDA, batch-norm statistics over the "
                                             "global batch (SyncBatchNorm; CUDA only, per rank on the CPU)"),
}


#: The runtime keys that change what a training run computes, tracked (dvc.yaml declares them for every stage that
#: trains; the resume fingerprint includes them). numerics and threads pick the numeric libraries' code paths and
#: how sums are split (both change the bits, on the CPU too); amp, channels_last, deterministic: other kernels on
#: CUDA; processes and sync_batchnorm: how the batch is split and its statistics (README "Reproducibility").
#: Untracked: device (auto records where a run ran in run.json), progress, prepare_workers, loader_workers (results
#: do not depend on them), cudnn_benchmark (off under deterministic; without it GPU results are not bit-exact
#: anyway).
TRACKED_RUNTIME = ("numerics", "threads", "amp", "channels_last", "deterministic", "processes", "sync_batchnorm")


def tracked_runtime(runtime: dict[str, Any]) -> dict[str, Any]:
    """The :data:`TRACKED_RUNTIME` values of a (validated) ``runtime`` section."""
    return {key: runtime[key] for key in TRACKED_RUNTIME}


def runtime_settings(runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """``runtime`` validated, with the schema's defaults for every key it leaves out (callers without a params
    file: tests, benchmarks)."""
    return check_section(runtime or {}, RUNTIME_SCHEMA, "runtime")


def loader_workers(runtime: dict[str, Any]) -> int:
    """``runtime.loader_workers`` as a process count: ``-1`` is one per CPU core this process may use, shared among
    the run's ``runtime.processes`` (each rank decodes its own share: 8 ranks on a 64-core node get 7 workers each,
    not 63), but one (the training process decodes too); 0 or more as written."""
    if runtime["loader_workers"] >= 0:
        return runtime["loader_workers"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, cores // max(1, int(runtime.get("processes", 1))) - 1)
