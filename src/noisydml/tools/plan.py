"""What a paper profile needs of the machine it names: hours, GPU memory, host memory and disk, each with its basis.

``noisydml profile plan <profile>`` prints it; ``noisydml profile list`` shows the totals and whether the profile fits
:data:`MACHINE`. Every figure is computed from the profile's own params (after its ``-S`` overrides, through DVC's
code) and the sizes of real tensors, never from a guess of a whole run:

- **GPU memory per training process**: the network's, the method's and the optimiser's tensors, built with the
  run's real sizes on PyTorch's ``meta`` device (no memory is allocated), plus the activations a training step
  keeps for its backward pass, measured once per backbone and input size on the CPU (a forward of two images with
  :func:`torch.autograd.graph.saved_tensors_hooks`, per image, times the images a step forwards with gradient),
  plus :data:`CUDA_OVERHEAD_BYTES` (assumed).
- **Host memory per run**: the process (:data:`PROCESS_BYTES`, measured on the CPU, plus the CUDA runtime, assumed),
  the dataset's index (the manifest's rows), the embedding passes the run keeps (every training row's and test
  row's features), the k-NN lists, a CPU copy of the training state when a checkpoint is written, SGM's pass for
  SGPS runs (the bytes per row measured at 100K identities, ``scripts/bench_faces_scale.py --series``) and the
  loader's workers (:data:`WORKER_BYTES`, assumed).
- **Disk**: the dataset (the benchmarks' published sizes; MS1MV0's estimated) and per run its checkpoint and its
  outputs (the model and method state, the embeddings of every training and test row).
- **Hours**: :func:`noisydml.tools.profiles.estimate` (the H100 rates of docs/gpu.md).

A profile *fits* when every run's GPU memory is within one GPU, :data:`MACHINE`'s GPUs can run its runs side by
side within the host memory, and its disk is within the node's; otherwise ``plan`` says which figure does not.
No stage imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

GIB = 2**30


@dataclass(frozen=True)
class Machine:
    """The node the profiles are sized for."""

    title: str
    gpus: int
    gpu_bytes: float
    host_bytes: float
    disk_bytes: float
    cores: int


#: Ours: one node of 8 x H100 80 GB (79.6 GiB each as the driver reports it, 90 % of it usable for tensors: the
#: rest is the allocator's fragmentation), 64 cores, 1 TiB of host memory, 8 TB of local NVMe. A run takes
#: ``runtime.processes`` GPUs; as many runs as fit in 8 GPUs run at once (``noisydml launch -j``).
MACHINE = Machine("one node: 8 x NVIDIA H100 80 GB, 64 cores, 1 TiB host memory, 8 TB local disk", 8,
                  0.9 * 79.6 * GIB, 1024 * GIB, 8e12, 64)
#: Assumed: the CUDA context, cuDNN/cuBLAS workspaces and the caching allocator's reserve on one GPU.
CUDA_OVERHEAD_BYTES = 2 * GIB
#: One training process with torch, faiss, MLflow and the pipeline imported: 0.9 GiB measured on the CPU (the
#: SGM series' starting RSS); the CUDA runtime adds about 2 GiB of host memory (assumed).
PROCESS_BYTES = 3 * GIB
#: Assumed: one DataLoader worker (a forked process decoding images; its own Python and the decoder's buffers).
WORKER_BYTES = 0.4 * GIB
#: The dataset's index per row in memory, measured on the full-size rehearsal's prepared sets (the manifest's pandas
#: memory, deep, and the image store's arrays): files 271 bytes (paths and checksums as text; SOP's 120,053 rows),
#: records 54 (integers and categories; 1M faces). Reading the CSV takes up to ~650 bytes a row for a moment.
INDEX_BYTES_PER_ROW = {"files": 271, "records": 54, "arrays": 60}
#: SGM's peak above the process's start per bank row, measured at 100K identities (scripts/bench_faces_scale.py
#: --series, docs/measurements/sgm_series_100k_identities.txt): 4,068 MiB at 400,000 rows (10.7 kB a row; 11.9 kB
#: at 200,000, 15.0 kB at 100,000): the centroid sums and unit vectors in float64, the candidate graph, the labels.
#: Taken as linear in the rows from the largest size measured (a power-law fit gives 0.75: less at 10M).
SGM_BYTES_PER_ROW = 10_700
#: The face sets: the size of insightface's train.rec (a benchmark's download size is its ``download_bytes``).
FACE_REC_BYTES = {"ms1mv0": 52e9, "ms1m_refined": 20e9, "ms1mv2": 30e9, "ms1mv3": 27e9}
#: Face evaluation sets (IJB-C's loose crops and meta files; the .bin sets): ~10 GB (estimated).
FACE_EVAL_DISK_BYTES = 10e9


@dataclass
class Figure:
    bytes: float
    basis: str

    def gib(self) -> str:
        return f"{self.bytes / GIB:,.1f} GiB"


@dataclass
class RunPlan:
    """One run's needs."""

    run: str
    method: str
    images: int
    classes: int
    test_images: int
    steps: int
    processes: int = 1
    gpu: dict[str, Figure] = field(default_factory=dict)
    host: dict[str, Figure] = field(default_factory=dict)
    disk: dict[str, Figure] = field(default_factory=dict)

    def total(self, what: str) -> float:
        return sum(f.bytes for f in getattr(self, what).values())


# ----------------------------------------------------------------------------------------------- tensor sizes
_ACTIVATIONS: dict[tuple, float] = {}


def activation_bytes_per_image(train_cfg: dict, side: int, in_channels: int = 3) -> float:
    """Bytes a training forward keeps for its backward, per image, for ``train_cfg``'s backbone and head at
    ``side`` x ``side`` input, float32: measured on the CPU with two images (each saved tensor's storage once)."""
    import torch

    from noisydml.models import build_model

    key = (train_cfg["backbone"], train_cfg["embedding_dim"], train_cfg["pooling"], side, in_channels,
           bool(train_cfg.get("frozen_bn")))
    if key in _ACTIVATIONS:
        return _ACTIVATIONS[key]
    torch.manual_seed(0)
    model = build_model({**train_cfg, "pretrained": "none"}, in_channels=in_channels).train()
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(2, in_channels, side, side)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        emb, _ = model.forward_with_features(x)
        emb.sum().backward()
    _ACTIVATIONS[key] = sum(seen.values()) / 2
    return _ACTIVATIONS[key]


def _state_bytes(tensors) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


_BUILT: dict[str, dict[str, float]] = {}


def built_sizes(run_params: dict, method: str, images: int, classes: int) -> dict[str, float]:
    """The bytes of the run's model, its method's parameters and buffers (built on the ``meta`` device at the real
    sizes: nothing is allocated) and its optimiser's state, and the model's feature width."""
    import json

    key = json.dumps([run_params["train"], method, run_params["methods"][method], images, classes], sort_keys=True,
                     default=str)
    if key not in _BUILT:
        _BUILT[key] = _built_sizes(run_params, method, images, classes)
    return _BUILT[key]


_MODELS: dict[str, tuple[float, int]] = {}


def _model_sizes(train_cfg: dict) -> tuple[float, int]:
    """The network's parameter bytes and its backbone's feature width, built once per architecture on ``meta``."""
    import json

    import torch

    from noisydml.models import build_model

    key = json.dumps({k: train_cfg[k] for k in ("backbone", "embedding_dim", "pooling")}, sort_keys=True)
    if key not in _MODELS:
        with torch.device("meta"):
            model = build_model({**train_cfg, "pretrained": "none"}, in_channels=3)
        _MODELS[key] = (_state_bytes(model.parameters()), int(getattr(model.backbone, "out_dim", 0)))
    return _MODELS[key]


def _built_sizes(run_params: dict, method: str, images: int, classes: int) -> dict[str, float]:
    import torch

    from noisydml.methods import build_method
    from noisydml.methods.base import MethodServices, MethodSetup
    from noisydml.models import build_model

    train_cfg = run_params["train"]
    model_params, feature_dim = _model_sizes(train_cfg)

    class _Services(MethodServices):  # a peer network of the same architecture, on meta too
        def build_network(self):
            with torch.device("meta"):
                return build_model({**train_cfg, "pretrained": "none"}, in_channels=3)

    labels = np.arange(images, dtype=np.int64) % max(classes, 1)
    with torch.device("meta"):
        built = build_method(method, MethodSetup(
            hparams=run_params["methods"][method], num_classes=classes, embedding_dim=train_cfg["embedding_dim"],
            dataset_size=images, train_labels=labels, seed=0, feature_dim=feature_dim, sample_ids=labels,
            services=_Services()))
    method_params = _state_bytes(built.parameters())
    method_buffers = _state_bytes(built.buffers())
    slots = {"adam": 2, "adamw": 2, "sgd": 1 if train_cfg["optimizer"]["momentum"] else 0}.get(
        train_cfg["optimizer"]["name"], 2)
    trainable = model_params + method_params
    return {"model": model_params, "method_params": method_params, "method_buffers": method_buffers,
            "gradients": trainable, "optimizer": slots * trainable, "slots": slots, "feature_dim": feature_dim}


# ----------------------------------------------------------------------------------------------- the plan
def _input_side(params: dict, dataset: str) -> tuple[int, str]:
    cfg = params["datasets"][dataset]
    if cfg["kind"] == "faces":
        return int(cfg["image_size"]), "records"
    if cfg["kind"] in ("glyphs", "motifs"):
        return int(cfg["image_size"]), "arrays"
    return int(params["train"]["input"]["crop"]), "files"


def _classes(params: dict, dataset: str) -> int:
    from noisydml.data.registry import known_train_classes

    return known_train_classes(params["datasets"][dataset])


def _dataset_disk(params: dict, dataset: str) -> Figure:
    cfg = params["datasets"][dataset]
    if cfg["kind"] == "faces":
        rec = FACE_REC_BYTES.get(cfg["release"], 0.0)
        return Figure(rec + FACE_EVAL_DISK_BYTES, f"{cfg['release']}'s train.rec (~{rec / 1e9:.0f} GB, estimated from "
                      "its images at ~5 kB a JPEG) + IJB-C and the .bin sets (~10 GB); read in place, not copied")
    from noisydml.data.benchmarks import BENCHMARKS

    size = BENCHMARKS[cfg["kind"]].download_bytes if cfg["kind"] in BENCHMARKS else 0.0
    return Figure(2 * size, f"{cfg['kind']}: the archives ({size / 1e9:.1f} GB, docs/datasets.md) and their "
                            "extracted files")


def run_plan(params: dict, run) -> RunPlan:
    """One run's figures (see the module docstring)."""
    from noisydml.engine.sampling import steps_per_epoch
    from noisydml.tools.profiles import _images

    run_params = run.params(params)
    train_cfg, method_cfg = run_params["train"], run_params["methods"][run.method]
    images, test_images = _images(params, run.dataset)
    classes = _classes(params, run.dataset)
    side, storage = _input_side(params, run.dataset)
    batch = train_cfg["batch"]["classes"] * train_cfg["batch"]["per_class"]
    processes = int(params["runtime"].get("processes", 1) or 1)
    steps = train_cfg["epochs"] * steps_per_epoch(images, batch)
    sizes = built_sizes(run_params, run.method, images, classes)
    plan = RunPlan(f"{run.dataset}/{run.noise}/{run.name}", run.method, images, classes, test_images, steps)
    per_image = activation_bytes_per_image(train_cfg, side)
    forwarded = batch // processes
    why = f"{batch // processes} images a step per process"
    if method_cfg.get("positive_source") == "forward":
        forwarded *= 1 + int(method_cfg["positives_per_sample"])
        why += f" x (1 + K = {method_cfg['positives_per_sample']} forwarded positives)"
    from noisydml.tools.profiles import TWO_NETWORKS

    if run.method in TWO_NETWORKS:
        forwarded *= 2
        why += " x 2 networks"
    plan.gpu = {
        "network, method parameters, gradients, optimiser": Figure(
            sizes["model"] + sizes["method_params"] + sizes["gradients"] + sizes["optimizer"],
            f"built on the meta device: network {sizes['model'] / GIB:.2f} GiB, method parameters "
            f"{sizes['method_params'] / GIB:.2f} GiB, their gradients, {sizes['slots']} optimiser slot(s)"),
        "method buffers (memories, banks, per-row state)": Figure(
            sizes["method_buffers"], f"built on the meta device at {images:,} rows and {classes:,} classes"),
        "activations kept for backward": Figure(
            per_image * forwarded, f"{per_image / 2**20:.1f} MiB an image at {side} px (measured, float32) x {why}"),
        "CUDA context and workspaces": Figure(CUDA_OVERHEAD_BYTES, "assumed"),
    }
    dim, feature_dim = train_cfg["embedding_dim"], sizes["feature_dim"]
    from noisydml.runtime import loader_workers

    workers = (max(0, MACHINE.cores // processes - 1) if params["runtime"]["loader_workers"] == -1
               else loader_workers(params["runtime"]))
    state = sizes["model"] + sizes["method_params"] + sizes["method_buffers"] + sizes["optimizer"]
    max_k = int(params["evaluate"]["max_k"])
    ranks = f" x {processes} processes" if processes > 1 else ""
    # the retrieval test split's rows (faces: the held-out identities, not the verification sets)
    searched = (int(params["datasets"][run.dataset]["test_identities"]) * images // max(classes, 1)
                if storage == "records" else test_images)
    plan.processes = processes
    plan.host = {
        "process": Figure(processes * PROCESS_BYTES, "measured 0.9 GiB on the CPU + the CUDA runtime (assumed "
                                                     f"2 GiB){ranks}"),
        "dataset index": Figure(processes * INDEX_BYTES_PER_ROW[storage] * (images + test_images),
                                f"{INDEX_BYTES_PER_ROW[storage]} bytes a row ({storage}: the manifest and the store's index, measured){ranks}"),
        "embedding passes kept": Figure(processes * 4 * (images + test_images) * (dim + feature_dim),
                                        f"every training and test row's {dim}-d embedding and {feature_dim}-d "
                                        f"feature, float32, gathered on every process{ranks}"),
        "k-NN lists": Figure(processes * 12 * searched * min(max_k, searched),
                             f"{searched:,} test rows x {min(max_k, searched)} neighbours x (id + distance){ranks}"),
        "checkpoint copy": Figure(state, "the training state copied to the CPU when rank 0 writes a checkpoint"),
        "loader workers": Figure(processes * workers * WORKER_BYTES,
                                 f"{workers} workers a process x {WORKER_BYTES / GIB:.1f} GiB (assumed){ranks}"),
    }
    if "sgm" in method_cfg:
        plan.host["SGM pass"] = Figure(
            SGM_BYTES_PER_ROW * images,
            f"{SGM_BYTES_PER_ROW:,} bytes a bank row (measured at 400K rows of 100K identities; "
            "scripts/bench_faces_scale.py --series), on rank 0 only (its labels are broadcast)")
    outputs = 4 * (images + test_images) * dim + sizes["model"] + sizes["method_params"] + sizes["method_buffers"]
    plan.disk = {
        "checkpoint": Figure(state, "network, method state and optimiser state, float32"),
        "run outputs": Figure(outputs, "model.pt (network and method state) and every training and test row's "
                                       f"{dim}-d embedding"),
    }
    return plan


@dataclass
class ProfilePlan:
    name: str
    runs: list[RunPlan]
    hours: float
    dataset_disk: dict[str, Figure]
    machine: Machine = MACHINE

    def largest(self, what: str) -> RunPlan:
        return max(self.runs, key=lambda r: r.total(what))

    def concurrent(self) -> int:
        """Runs side by side: as many as the GPUs hold at their ``processes`` each."""
        return max(1, min(self.machine.gpus // max(r.processes for r in self.runs), len(self.runs)))

    def host_needed(self) -> float:
        """The host memory of the :meth:`concurrent` largest runs side by side."""
        totals = sorted((r.total("host") for r in self.runs), reverse=True)
        return float(sum(totals[: self.concurrent()]))

    def disk_needed(self) -> float:
        return sum(f.bytes for f in self.dataset_disk.values()) + sum(r.total("disk") for r in self.runs)

    def misfits(self) -> list[str]:
        out = []
        gpu = self.largest("gpu")
        if gpu.total("gpu") > self.machine.gpu_bytes:
            out.append(f"GPU memory: {gpu.run} needs {gpu.total('gpu') / GIB:,.1f} GiB on one GPU, "
                       f"{self.machine.gpu_bytes / GIB:,.1f} GiB usable")
        if self.host_needed() > self.machine.host_bytes:
            out.append(f"host memory: {self.concurrent()} runs at once need {self.host_needed() / GIB:,.0f} GiB, "
                       f"the node has {self.machine.host_bytes / GIB:,.0f} GiB")
        if self.disk_needed() > self.machine.disk_bytes:
            out.append(f"disk: {self.disk_needed() / 1e12:,.2f} TB, the node has {self.machine.disk_bytes / 1e12:,.0f} TB")
        return out


def selection_settings(params: dict) -> list[dict]:
    """The distinct PRISM selections (PCS) a profile's runs make: training classes, memory, R, P x K, per run of
    a method with a class-centre memory and a sliding window (PRISM, SGPS and their variants, DCQ + SGPS)."""
    from noisydml.runs import runs_of

    out = {}
    for run in runs_of(params):
        run_params = run.params(params)
        hp = run_params["methods"][run.method]
        if not {"memory_size", "noise_rate", "window"} <= set(hp):
            continue
        batch = run_params["train"]["batch"]
        key = (_classes(params, run.dataset), int(hp["memory_size"]), float(hp["noise_rate"]),
               int(batch["classes"]), int(batch["per_class"]))
        out[key] = dict(zip(("classes", "memory_size", "noise_rate", "classes_per_batch", "per_class"), key))
    return list(out.values())


def profile_plan(name: str, params: dict) -> ProfilePlan:
    """The plan of profile ``name`` from its params after its overrides (:func:`noisydml.tools.profiles.params_after`)."""
    from noisydml.tools.profiles import estimate
    from noisydml.runs import runs_of

    runs = [run_plan(params, run) for run in runs_of(params)]
    datasets = sorted({r.run.split("/")[0] for r in runs})
    return ProfilePlan(name, runs, estimate(params)["gpu_hours"], {d: _dataset_disk(params, d) for d in datasets})


def plan_text(plan: ProfilePlan) -> str:
    """Markdown: the profile's totals against the machine, then the largest run's figures with their basis."""
    misfits = plan.misfits()
    lines = [f"## {plan.name}", "", f"Machine: {plan.machine.title}.", "",
             "| figure | needed | basis |", "|---|---|---|",
             f"| GPU hours | {plan.hours:,.1f} | the profile's steps at the H100 rates of docs/gpu.md "
             "(noisydml.tools.profiles.estimate) |",
             f"| GPU memory, largest run | {plan.largest('gpu').total('gpu') / GIB:,.1f} GiB | "
             f"{plan.largest('gpu').run}, per process (below) |",
             f"| host memory, {plan.concurrent()} run(s) at once | {plan.host_needed() / GIB:,.0f} GiB | the largest "
             f"runs' figures (below), {plan.runs[0].processes} GPU(s) a run |",
             f"| disk | {plan.disk_needed() / 1e9:,.0f} GB | the datasets and every run's checkpoint and outputs |",
             "", "**Fits.**" if not misfits else "**Does not fit**: " + "; ".join(misfits) + ".", ""]
    for what, title in (("gpu", "GPU memory per process"), ("host", "host memory"), ("disk", "disk")):
        run = plan.largest(what)
        lines += [f"**{title}**, largest run `{run.run}` ({run.images:,} training images, {run.classes:,} classes, "
                  f"{run.steps:,} steps, {run.processes} process(es)):", "", "| part | size | basis |", "|---|---|---|"]
        lines += [f"| {part} | {fig.gib()} | {fig.basis} |" for part, fig in getattr(run, what).items()]
        lines.append("")
    for dataset, fig in plan.dataset_disk.items():
        lines.append(f"- dataset `{dataset}`: {fig.bytes / 1e9:,.0f} GB ({fig.basis})")
    return "\n".join(lines) + "\n"


def summary_row(plan: ProfilePlan) -> dict[str, Any]:
    """The columns ``profile list`` shows."""
    return {"gpu_gib": plan.largest("gpu").total("gpu") / GIB, "host_gib": plan.host_needed() / GIB,
            "disk_gb": plan.disk_needed() / 1e9, "fits": not plan.misfits(), "misfits": plan.misfits()}
