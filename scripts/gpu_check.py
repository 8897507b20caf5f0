"""The GPU check: what this project's GPU path does on a GPU machine, in one short call; prints figures and writes
them, section by section, to a JSON file (a run cut short still reports what it finished).

It runs the package from ``src/`` on the machine's own torch (no install), on data it makes itself (random
weights, random tensors, JPEGs it encodes): nothing has to be downloaded there. Sections, most valuable first,
each with fixed warm-up and timed steps (``--toy``: tiny sizes, for the CPU test in tests/test_gpu_check.py):

- ``environment``: torch (the machine's, and the version this project pins), CUDA, the GPU, the cores, which of
  the project's packages import;
- ``train_stage``: ``stages/train.py`` on a generated glyph miniature without DVC (download, prepare, corrupt,
  train as plain processes; the evaluate stage's metrics of its embeddings), twice on CUDA with ``runtime.deterministic: true`` and once on the CPU:
  are the two CUDA runs' embeddings identical bits, and how far are the metrics from the CPU's;
- ``knn``: evaluation at SOP scale (60,502 x 512 random unit vectors, 11,316 classes): the exact torch search
  (``evaluate.device: cuda``) and faiss on the CPU, their times, peak GPU memory and agreement;
- ``backbones``: images/s of forward + backward of BN-Inception and ResNet-50 at 224 px, batch 64 (the profiles'
  16 x 4), AMP float32 / float16 / bfloat16, channels-last off and on; peak GPU memory;
- ``methods``: images/s of a full training step (forward, the method's loss, backward, optimizer step) of MCL,
  PRISM, SGPS (bank positives; forwarded positives: 64 + 256 images a step) and BSPML on BN-Inception at 224 px,
  AMP float32 / float16 / bfloat16;
- ``decode``: JPEG decode + the training augmentation (``noisydml.data.images.InputPipeline``), images/s with
  0..N DataLoader workers on the machine's cores, and GPU decoding (``torchvision.io.decode_jpeg`` on CUDA) with
  the same crop, flip and normalisation on the GPU;
- ``ddp``: the project's DDP code (``noisydml.engine.distributed``) with 2 processes on CUDA tensors of one GPU
  over gloo (NCCL refuses two ranks on one GPU: it needs two GPUs, so it is not checked here).

One-call recipe for the device tool (an H100 or H200 machine: Python 3.12, torch 2.11 preinstalled; no faiss,
pytorch-metric-learning, pydantic or ruamel.yaml, nothing downloadable):

1. Here, once (8 wheels, 21 MiB, for Python 3.12, at the versions this environment runs)::

       echo /.whl/ >> .git/info/exclude
       python scripts/gpu_check.py --fetch-wheels .whl

2. ``run`` with ``carry: [".whl"]``, ``timeout_s: 420``, and the command::

       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
       && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
       && python3 scripts/gpu_check.py --out $OUT/gpu_check.json --budget 330 2>&1 | tee $OUT/gpu_check.log

   (one line, ``&&`` between the parts). ``--budget`` seconds: a section that would start past it is skipped
   and says so; the sections above take about 5 minutes together by our estimate, the machine's start not
   counted.
3. ``give_back`` unless rerunning at once. Paste ``gpu_check.json``'s table (printed at the end) into the note.

On the CPU (``--toy``, or a machine without CUDA) every section runs on the CPU and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # the package from the working tree (nothing is installed on the device)
    sys.path.insert(0, str(SRC))

#: The packages the training path needs beyond what the device's image has (KINDS.md's list): fetched as wheels
#: for Python 3.12 at the versions installed here. DVC, MLflow, Ray and Optuna are not needed to train.
WHEELS = ("faiss-cpu", "pytorch-metric-learning", "pydantic", "pydantic-core", "annotated-types",
          "typing-inspection", "typing-extensions", "ruamel.yaml")  # typing-extensions: pydantic needs a recent one
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                   "manylinux1_x86_64")
WHEEL_BUDGET_MIB = 40

#: What the training path imports, and what it does without each (tracking.py, tools/launch.py).
PACKAGES = {"torch": "required", "torchvision": "required", "numpy": "required", "pytorch_metric_learning": "required",
            "faiss": "required (evaluation on the CPU, methods' kNN)", "pydantic": "required (params)",
            "ruamel.yaml": "required (params.yaml)", "pandas": "required", "PIL": "required (images)",
            "mlflow": "optional: runs go untracked without it", "dvc": "optional: the stages run as plain processes",
            "ray": "optional: the launcher only", "optuna": "optional: tuning only"}

SIZES = {
    "full": {"knn": (60_502, 512, 11_316), "knn_k": (32, 1023), "batch": 64, "image": 224, "warmup": 3, "steps": 10,
             "method_rows": 6_400, "photos": 512, "photo_size": (500, 375), "workers": None, "gpu_decode_batch": 64,
             "glyph_classes": 40, "glyph_images": 16, "epochs": 2},
    "toy": {"knn": (600, 16, 60), "knn_k": (8, 40), "batch": 8, "image": 64, "warmup": 1, "steps": 1,
            "method_rows": 64, "photos": 8, "photo_size": (96, 72), "workers": [0, 1], "gpu_decode_batch": 4,
            "glyph_classes": 8, "glyph_images": 8, "epochs": 1},
}

#: Seconds each section is expected to take at full size on an H100 (ours; a section is skipped when the budget
#: left is below its estimate).
ESTIMATES = {"environment": 5, "train_stage": 90, "knn": 40, "backbones": 60, "methods": 60, "decode": 45, "ddp": 20}


# --------------------------------------------------------------------------------------------------- the report

class Report:
    """The check's JSON, rewritten atomically after every section."""

    def __init__(self, path: Path | None, budget: float):
        self.path, self.budget, self.started = path, budget, time.monotonic()
        self.data: dict = {"sections": {}, "skipped": {}}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    def run(self, name: str, fn, *args) -> None:
        if self.left() < ESTIMATES[name] * (1 if self.data.get("full") else 0):
            self.data["skipped"][name] = f"{self.left():.0f} s of the budget left, about {ESTIMATES[name]} s needed"
            print(f"== {name}: skipped ({self.data['skipped'][name]})", flush=True)
            self.write()
            return
        print(f"== {name}", flush=True)
        t0 = time.monotonic()
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001 - a failing section is a finding; the next one still runs
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            print(result["traceback"], flush=True)
        result["seconds"] = round(time.monotonic() - t0, 1)
        self.data["sections"][name] = result
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def _device():
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_reset(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def _max_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kilobytes on Linux


def _timed(fn, warmup: int, steps: int, device) -> float:
    """Seconds per call of ``fn``: ``warmup`` calls, then the mean of ``steps`` timed calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / steps


# ---------------------------------------------------------------------------------------------------- sections

def pinned_torch() -> str | None:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"torch==([^"]+)"', text)
    return found.group(1) if found else None


def section_environment(size: dict) -> dict:
    import importlib

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "torch_pinned_by_project": pinned_torch(),
           "cuda_available": torch.cuda.is_available(), "cuda_runtime": torch.version.cuda,
           "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "cpu": platform.processor() or platform.machine(), "packages": {}}
    try:
        import torchvision

        out["torchvision"] = torchvision.__version__
    except ImportError as e:
        out["torchvision"] = f"missing: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count, bf16_supported=torch.cuda.is_bf16_supported())
    for name, role in PACKAGES.items():
        try:
            module = importlib.import_module(name)
            out["packages"][name] = getattr(module, "__version__", "present")
        except ImportError:
            out["packages"][name] = f"missing ({role})"
    print(f"torch {out['torch']} here; the project pins {out['torch_pinned_by_project']}"
          + ("" if out["torch"].split("+")[0] == out["torch_pinned_by_project"] else
             " (a different version: results may differ in the last bits from the pinned one's)"))
    print(json.dumps({k: v for k, v in out.items() if k != "packages"}))
    print("packages:", json.dumps(out["packages"]))
    return out


def section_knn(size: dict) -> dict:
    import torch

    from noisydml.evaluation.retrieval import retrieval_metrics
    from noisydml.neighbours import exact_topk, topk_block_rows

    n, dim, classes = size["knn"]
    device = _device()
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    labels = torch.randint(0, classes, (n,), generator=g).numpy()
    out = {"device": str(device), "n": n, "dim": dim, "classes": classes,
           "block_rows": topk_block_rows(n), "threads": torch.get_num_threads()}
    x = emb.to(device)
    rss_before = _max_rss_gib()
    for k in size["knn_k"]:
        _peak_reset(device)
        # one warm-up and two timed searches on a GPU; on a CPU one timed search (minutes at SOP size)
        seconds = _timed(lambda: exact_topk(x, x, k + 1, "l2"), *((1, 2) if device.type == "cuda" else (0, 1)), device)
        out[f"torch_search_k{k}_s"] = round(seconds, 3)
        # GPU: torch's peak allocation; CPU: how far the process's peak resident memory rose above its level
        # before the first search (the blocks' memory, reused between them)
        out[f"torch_search_k{k}_peak_gib"] = _peak_gib(device) if device.type == "cuda" else \
            round(_max_rss_gib() - rss_before, 2)
        print(f"torch exact search, {n:,} x {dim} against itself, k={k}: {seconds:.2f} s on {device}, "
              f"peak {out[f'torch_search_k{k}_peak_gib']} GiB")
    t0 = time.perf_counter()
    metrics_torch = retrieval_metrics(emb.numpy(), labels, recall_at=(1, 2, 4, 8, 16, 32), nmi=False,
                                      device=device.type, knn="torch")
    out["torch_metrics_s"] = round(time.perf_counter() - t0, 2)
    try:
        import faiss
    except ImportError as e:
        out["faiss"] = f"missing: {e}"
        return out
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    k = size["knn_k"][0]
    index = faiss.IndexFlatL2(dim)
    t0 = time.perf_counter()
    index.add(emb.numpy())
    _, faiss_ids = index.search(emb.numpy(), k + 1)
    out[f"faiss_cpu_search_k{k}_s"] = round(time.perf_counter() - t0, 2)
    out["faiss_threads"] = faiss.omp_get_max_threads()
    _, torch_ids = exact_topk(x, x, k + 1, "l2")
    same = (torch_ids.cpu().numpy() == faiss_ids).all(axis=1)
    out["rows_with_identical_neighbours"] = float(same.mean())
    t0 = time.perf_counter()
    metrics_faiss = retrieval_metrics(emb.numpy(), labels, recall_at=(1, 2, 4, 8, 16, 32), nmi=False)
    out["faiss_metrics_s"] = round(time.perf_counter() - t0, 2)
    out["max_metric_difference"] = max(abs(metrics_torch[m] - metrics_faiss[m]) for m in metrics_faiss)
    print(f"faiss-cpu search k={k}: {out[f'faiss_cpu_search_k{k}_s']} s on {out['faiss_threads']} threads; "
          f"identical neighbour lists: {same.mean():.4%} of rows; largest metric difference "
          f"{out['max_metric_difference']:.2e}")
    return out


def _step_fn(model, loss_of, optimizer, amp: str, device, scaler):

    from noisydml.engine.strategy import autocast

    def step():
        loss = loss_of(lambda x: _forward(model, x, amp, device, autocast))
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def _forward(model, x, amp, device, autocast):
    with autocast(device, amp):
        emb, feats = model.forward_with_features(x)
    return emb.float(), feats.float()


def _amps(device) -> list[str]:
    return ["float32", "float16", "bfloat16"] if device.type == "cuda" else ["float32"]


def section_backbones(size: dict) -> dict:
    import torch

    from noisydml.models import build_model

    device = _device()
    batch, image = size["batch"], size["image"]
    rows = []
    for backbone in ("bn_inception", "resnet50"):
        for amp in _amps(device):
            for channels_last in ([False, True] if device.type == "cuda" else [False]):
                torch.manual_seed(0)
                model = build_model(_train_cfg(backbone), in_channels=3).to(device)
                fmt = torch.channels_last if channels_last else torch.contiguous_format
                model = model.to(memory_format=fmt)
                x = torch.randn(batch, 3, image, image, device=device).to(memory_format=fmt)
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
                scaler = torch.amp.GradScaler("cuda", enabled=amp == "float16")
                _peak_reset(device)
                step = _step_fn(model, lambda fwd: fwd(x)[0].square().mean(), optimizer, amp, device, scaler)
                seconds = _timed(step, size["warmup"], size["steps"], device)
                row = {"backbone": backbone, "amp": amp, "channels_last": channels_last, "batch": batch,
                       "image": image, "images_per_s": round(batch / seconds, 1), "peak_gib": _peak_gib(device)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {"device": str(device), "rows": rows}


def _train_cfg(backbone: str) -> dict:
    from noisydml.config import load_params

    train = load_params(ROOT / "params.yaml", sections=("train",))["train"]
    train = json.loads(json.dumps(train))
    train.update(backbone=backbone, pretrained="none", embedding_dim=512 if backbone != "small_cnn" else 64,
                 pooling="max" if backbone == "bn_inception" else "avg")
    return train


def section_methods(size: dict) -> dict:
    import copy

    import numpy as np
    import torch

    from noisydml.config import load_params
    from noisydml.methods import build_method, check_method
    from noisydml.methods.base import Batch, MethodSetup
    from noisydml.methods.parts.sgm import run_sgm
    from noisydml.models import build_model

    device = _device()
    params = load_params(ROOT / "params.yaml", sections=("train", "methods"))
    batch, image, n = size["batch"], size["image"], size["method_rows"]
    per_class = 4
    classes = n // per_class
    labels = np.repeat(np.arange(classes), per_class)
    labels_t = torch.from_numpy(labels).to(device)
    rng = np.random.default_rng(0)
    rows_out = []
    variants = {"mcl": ("mcl", None), "prism": ("prism", None), "sgps_bank": ("sgps", "bank"),
                "sgps_forward": ("sgps", "forward"), "bspml": ("bspml", None)}
    for label, (name, source) in variants.items():
        for amp in _amps(device):
            p = copy.deepcopy(params)
            if source is not None:
                p["methods"][name]["positive_source"] = source
            hp = check_method(p, name)
            train = _train_cfg("bn_inception")
            torch.manual_seed(0)
            model = build_model(train, in_channels=3).to(device)
            method = build_method(name, MethodSetup(hp, classes, train["embedding_dim"], n, labels, seed=0,
                                                    feature_dim=int(getattr(model.backbone, "out_dim", 0)))).to(device)
            if name == "sgps":  # SGM's labels as after one epoch-boundary pass, on a random bank
                bank = torch.nn.functional.normalize(torch.randn(n, train["embedding_dim"]), dim=1)
                method.bank.copy_(bank.to(method.bank.device))
                r = run_sgm(bank.numpy(), labels, hp["sgm"], np.random.default_rng(0))
                method.bottom_up_labels.copy_(torch.from_numpy(r.bottom_up))
                method.top_down_labels.copy_(torch.from_numpy(r.top_down))
                method.sgm_round.fill_(1)
                method._set_pools()
            optimizer = torch.optim.Adam(list(model.parameters()) + list(method.parameters()), lr=1e-5)
            scaler = torch.amp.GradScaler("cuda", enabled=amp == "float16")
            state = {"step": 0}
            images = {}

            def loss_of(fwd):
                idx = np.sort(rng.choice(classes, batch // per_class, replace=False))
                rows = (idx[:, None] * per_class + np.arange(per_class)).ravel()
                request = method.extra_samples(rows, 0, state["step"])  # an ExtraRows request (or None)
                extra = None if request is None else request.rows
                every = rows if extra is None else np.concatenate([rows, extra])
                key = len(every)
                if key not in images:  # random inputs, made once per shape (decoding is the decode section's)
                    images[key] = torch.randn(key, 3, image, image, device=device)
                emb, feats = fwd(images[key])
                index = torch.from_numpy(rows).to(device)
                extra_batch = None
                if extra is not None:
                    extra_index = torch.from_numpy(extra).to(device)
                    extra_batch = Batch(emb[len(rows):], feats[len(rows):], labels_t[extra_index], extra_index,
                                        extra_index, step=state["step"], epoch=0, request=request)
                    emb, feats = emb[:len(rows)], feats[:len(rows)]
                b = Batch(emb, feats, labels_t[index], index, index, step=state["step"], epoch=0, extra=extra_batch)
                loss, _ = method.loss(b)
                state["step"] += 1
                state["images"] = key
                return loss

            _peak_reset(device)
            seconds = _timed(_step_fn(model, loss_of, optimizer, amp, device, scaler), size["warmup"], size["steps"],
                             device)
            row = {"method": label, "amp": amp, "batch": batch, "images_per_step": state["images"], "image": image,
                   "steps_per_s": round(1 / seconds, 2), "images_per_s": round(state["images"] / seconds, 1),
                   "peak_gib": _peak_gib(device)}
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    return {"device": str(device), "backbone": "bn_inception", "rows": rows_out}


def _make_photos(root: Path, n: int, size: tuple[int, int]) -> list[str]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        img = rng.uniform(0, 255, 3) + xx[..., None] * rng.uniform(-0.4, 0.4, 3) + yy[..., None] * rng.uniform(-.4, .4, 3)
        img += rng.normal(0, 10, (h, w, 3))
        path = root / f"{i:06d}.jpg"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(str(path))
    return paths


def section_decode(size: dict) -> dict:
    import numpy as np

    from noisydml.data.images import ImageFiles, InputPipeline, InputTransform

    device = _device()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = size["workers"] or sorted({0, 1, 2, 4, 8, max(1, cores - 1)})
    out = {"cores": cores, "photo_size": list(size["photo_size"]), "photos": size["photos"], "rows": []}
    crop = size["image"]
    with tempfile.TemporaryDirectory() as tmp:
        paths = _make_photos(Path(tmp), size["photos"], size["photo_size"])
        files = ImageFiles(paths, np.arange(len(paths)))
        batch = size["batch"]
        batches = [np.arange(i, min(i + batch, len(paths))) for i in range(0, len(paths), batch)]
        transform = InputTransform(crop=crop, resize=int(crop * 256 / 224))
        for w in workers:
            pipe = InputPipeline(transform, seed=0, workers=w, pin_memory=device.type == "cuda")
            list(pipe.train_batches(files, batches[:1], epoch=99))  # the workers' start, the page cache
            t0 = time.perf_counter()
            count = sum(len(x.to(device, non_blocking=True)) for x in pipe.train_batches(files, batches, epoch=0))
            _sync(device)
            rate = count / (time.perf_counter() - t0)
            out["rows"].append({"decoder": "PIL (CPU)", "workers": w, "images_per_s": round(rate, 1)})
            print(json.dumps(out["rows"][-1]), flush=True)
            del pipe
        if device.type == "cuda":
            out["rows"].append(_gpu_decode(paths, transform, size["gpu_decode_batch"], device))
            print(json.dumps(out["rows"][-1]), flush=True)
    return out


def _gpu_decode(paths: list[str], transform, batch: int, device) -> dict:
    """nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``, then the training augmentation on the GPU
    (per image: RandomResizedCrop to the crop, flip; then the batch normalised): the rate a GPU-side input
    pipeline could reach (not the pipeline's own path yet: docs/gpu.md)."""
    import torch
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import v2

    data = [read_file(p) for p in paths]
    crop = v2.Compose([v2.RandomResizedCrop(transform.crop, scale=(transform.scale_min, 1.0), antialias=True),
                       v2.RandomHorizontalFlip()])
    mean = torch.tensor(transform.mean, device=device).view(1, 3, 1, 1)
    std = torch.tensor(transform.std, device=device).view(1, 3, 1, 1)

    def one_pass() -> int:
        count = 0
        for i in range(0, len(data), batch):
            decoded = decode_jpeg(data[i:i + batch], device=device)
            x = torch.stack([crop(img) for img in decoded]).float().div_(255)
            x = (x - mean) / std
            count += len(x)
        return count

    one_pass()
    _sync(device)
    t0 = time.perf_counter()
    count = one_pass()
    _sync(device)
    return {"decoder": "nvJPEG (torchvision.io.decode_jpeg on CUDA) + augmentation on the GPU", "workers": 0,
            "images_per_s": round(count / (time.perf_counter() - t0), 1)}


def section_ddp(size: dict) -> dict:
    """Two processes, gloo, CUDA tensors of one GPU (both ranks on device 0)."""
    import torch.multiprocessing as mp

    device = _device()
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "ddp.json"
        mp.start_processes(_ddp_worker, args=(2, str(device), str(result), tmp), nprocs=2, start_method="spawn")
        out = json.loads(result.read_text())
    out["all_passed"] = all(v is True for k, v in out.items() if k not in ("device", "backend", "processes"))
    out["nccl"] = "not checked: NCCL needs one GPU per rank (this machine has one)"
    print(json.dumps(out))
    return out


def _ddp_worker(rank: int, world: int, device_name: str, result: str, tmp: str) -> None:
    sys.path.insert(0, str(SRC))
    import torch
    import torch.distributed as dist

    from noisydml.engine.distributed import Distributed

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    device = torch.device(device_name)
    ddp = Distributed(rank, world, "gloo")
    torch.manual_seed(0)
    full = torch.randn(8, 4, device=device)
    weight = torch.randn(4, 3, device=device)
    checks: dict = {}

    def check(name: str, fn) -> None:
        # each on its own: PyTorch's table lists gloo's all_gather as CPU-only, which this finds out for real
        try:
            checks[name] = bool(fn())
        except Exception as e:  # noqa: BLE001 - recorded as the finding
            checks[name] = f"{type(e).__name__}: {str(e)[:300]}"

    def gather_rows() -> bool:
        # the global batch gathered from each rank's rows; the gradient reaching a rank's rows is the one-process
        # one times the world size (DDP then averages)
        own = full[rank * 4:(rank + 1) * 4].clone().requires_grad_(True)
        gathered = ddp.gather_rows(own)
        (gathered @ weight).square().sum().backward()
        reference = full.clone().requires_grad_(True)
        (reference @ weight).square().sum().backward()
        return torch.equal(gathered.detach(), full) and \
            torch.allclose(own.grad, world * reference.grad[rank * 4:(rank + 1) * 4])

    def average_gradients() -> bool:  # a method's own parameters (proxies)
        param = torch.nn.Parameter(torch.zeros(3, device=device))
        param.grad = torch.full((3,), float(rank + 1), device=device)
        ddp.average_gradients([param])
        return torch.equal(param.grad, torch.full((3,), 1.5, device=device))

    def broadcast_buffers() -> bool:
        bn = torch.nn.BatchNorm1d(3).to(device)
        bn.running_mean.fill_(float(rank))
        ddp.broadcast_buffers(bn)
        return torch.equal(bn.running_mean, torch.zeros(3, device=device))

    def gather_shards() -> bool:  # embedding passes
        shards = ddp.gather_shards(torch.arange(3, device=device).float() + 3 * rank, 5)
        return torch.equal(shards, torch.arange(5, device=device).float())

    def ddp_gradients() -> bool:  # DistributedDataParallel itself
        model = torch.nn.Linear(4, 3).to(device)
        wrapped = torch.nn.parallel.DistributedDataParallel(model)  # held: its reducer averages in backward
        wrapped(full[rank * 4:(rank + 1) * 4]).sum().backward()
        grad = model.weight.grad.clone()
        dist.all_reduce(grad)
        return torch.allclose(grad / world, model.weight.grad)

    for name, fn in (("gather_rows", gather_rows), ("average_gradients", average_gradients),
                     ("broadcast_buffers", broadcast_buffers), ("gather_shards", gather_shards),
                     ("ddp_gradients_equal_across_ranks", ddp_gradients)):
        check(name, fn)
        dist.barrier()
    if rank == 0:
        Path(result).write_text(json.dumps({"device": device_name, "backend": "gloo", "processes": world, **checks}))
    dist.barrier()
    dist.destroy_process_group()


def _write_params(src: Path, dst: Path, edits: dict) -> None:
    """params.yaml with ``edits`` (dotted keys), read and written as DVC does (YAML 1.2, ruamel)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    data = yaml.load(src.read_text())
    for dotted, value in edits.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    with dst.open("w") as f:
        yaml.dump(data, f)


def section_train_stage(size: dict) -> dict:
    """The training stage on a glyph miniature, as DVC would run it but as plain processes: download, prepare,
    corrupt, train; then the evaluate stage's metrics of its test embeddings (faiss on the CPU)."""
    import numpy as np
    import torch

    from noisydml.evaluation.retrieval import retrieval_metrics

    devices = ([("cuda_a", "cuda"), ("cuda_b", "cuda")] if torch.cuda.is_available() else []) + [("cpu", "cpu")]
    out: dict = {"runs": {}}
    run = "runs/glyphs/sym50/mcl/seed0"
    for key, device in devices:
        work = Path(tempfile.mkdtemp(prefix=f"gpu_check_{key}_"))
        _write_params(ROOT / "params.yaml", work / "params.yaml", {
            "datasets.glyphs.num_classes": size["glyph_classes"], "datasets.glyphs.images_per_class": size["glyph_images"],
            "train.pretrained": "none", "train.epochs": size["epochs"], "train.eval_every": 1,
            "runtime.device": device, "runtime.deterministic": True, "runtime.progress": False,
            "grid.noises": ["sym50"], "grid.methods": ["mcl"], "grid.seeds": [0], "chains": {},
            "train.batch": {"classes": min(16, size["glyph_classes"] // 2), "per_class": 4}})
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
        t0 = time.perf_counter()
        log = []
        for command in (["download.py", "--dataset", "glyphs"], ["prepare.py", "--dataset", "glyphs"],
                        ["corrupt.py", "--dataset", "glyphs", "--noise", "sym50"],
                        ["train.py", "--run-folder", run]):
            done = subprocess.run([sys.executable, str(ROOT / "stages" / command[0]), *command[1:]], cwd=work,
                                  env=env, capture_output=True, text=True)
            log.append(f"$ {' '.join(command)} -> {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
            if done.returncode:
                raise RuntimeError(f"{command[0]} failed on {device}:\n" + "\n".join(log)[-6000:])
        saved = np.load(work / run / "test_embeddings.npz")
        emb = saved["embeddings"]
        # the evaluate stage's metrics, on the CPU for every run (so only training differs between them)
        metrics = retrieval_metrics(emb, saved["labels"], recall_at=(1,), nmi=False)
        run_info = json.loads((work / run / "run.json").read_text())
        out["runs"][key] = {"seconds": round(time.perf_counter() - t0, 1),
                            "metrics": {k: metrics[k] for k in ("precision_at_1", "mean_average_precision_at_r")
                                        if k in metrics},
                            "environment_recorded": run_info.get("environment"), "embeddings_sha": _sha(emb), "work": str(work)}
        out["runs"][key]["_embeddings"] = emb
        print(f"train stage, {key}: {out['runs'][key]['seconds']} s, {out['runs'][key]['metrics']}", flush=True)
    runs = out["runs"]
    if "cuda_b" in runs:
        out["cuda_runs_identical_bits"] = runs["cuda_a"]["embeddings_sha"] == runs["cuda_b"]["embeddings_sha"]
        reference, cpu = runs["cuda_a"], runs["cpu"]
        out["cuda_vs_cpu"] = {
            "max_embedding_difference": float(np.abs(reference["_embeddings"] - cpu["_embeddings"]).max()),
            "metric_differences": {k: abs(reference["metrics"][k] - cpu["metrics"][k]) for k in reference["metrics"]},
            "note": "same torch on both; CUDA and CPU kernels differ in rounding, which training amplifies"}
    for r in runs.values():
        del r["_embeddings"]
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))
    return out


def _sha(array) -> str:
    import hashlib

    return hashlib.sha256(array.tobytes()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------- the wheels

def fetch_wheels(folder: Path) -> int:
    """Download the :data:`WHEELS` for Python 3.12 on x86-64 Linux, at the versions installed here; print the
    total. Returns the exit status."""
    from importlib.metadata import PackageNotFoundError, version

    folder.mkdir(parents=True, exist_ok=True)
    wanted = []
    for name in WHEELS:
        try:
            wanted.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            print(f"{name} is not installed here: install the project first (pip install -e .)")
            return 1
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *[f"--platform={p}" for p in WHEEL_PLATFORMS], "-d", str(folder), *wanted]
    print(" ".join(command))
    if subprocess.call(command):
        return 1
    wheels = sorted(folder.glob("*.whl"))
    total = sum(p.stat().st_size for p in wheels) / 2**20
    for p in wheels:
        print(f"  {p.stat().st_size / 2**20:6.1f} MiB  {p.name}")
    print(f"{len(wheels)} wheels, {total:.1f} MiB (budget {WHEEL_BUDGET_MIB} MiB)")
    return 0 if total < WHEEL_BUDGET_MIB else 1


# -------------------------------------------------------------------------------------------------------- main

SECTIONS = {"environment": section_environment, "train_stage": section_train_stage, "knn": section_knn,
            "backbones": section_backbones, "methods": section_methods, "decode": section_decode,
            "ddp": section_ddp}


def table(data: dict) -> str:
    """The figures as markdown, for the note."""
    lines = []
    s = data["sections"]
    env = s.get("environment", {})
    lines.append(f"GPU check: {env.get('gpu', 'no GPU')}, torch {env.get('torch')} (project pins "
                 f"{env.get('torch_pinned_by_project')}), {env.get('cpu_cores')} cores")
    for name in ("backbones", "methods"):
        rows = s.get(name, {}).get("rows", [])
        if rows:
            keys = [k for k in rows[0] if k not in ("image",)]
            lines += ["", f"| {' | '.join(keys)} |", "|" + "---|" * len(keys)]
            lines += [f"| {' | '.join(str(r.get(k)) for k in keys)} |" for r in rows]
    if s.get("decode", {}).get("rows"):
        lines += ["", "| decoder | workers | images/s |", "|---|---|---|"]
        lines += [f"| {r['decoder']} | {r['workers']} | {r['images_per_s']} |" for r in s["decode"]["rows"]]
    for name in ("knn", "train_stage", "ddp"):
        if name in s:
            flat = json.loads(json.dumps({k: v for k, v in s[name].items() if k != "traceback"}, default=str))
            for run in flat.get("runs", {}).values():
                run.pop("work", None)
            lines += ["", f"{name}: {json.dumps(flat)}"]
    if data.get("skipped"):
        lines += ["", f"skipped: {json.dumps(data['skipped'])}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the JSON file, rewritten after every section")
    parser.add_argument("--budget", type=float, default=330, help="seconds; a section that would not fit is skipped")
    parser.add_argument("--toy", action="store_true", help="tiny sizes (the CPU test)")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--fetch-wheels", type=Path, metavar="FOLDER",
                        help="download the wheels the device lacks into FOLDER, then exit")
    args = parser.parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(args.fetch_wheels)
    size = SIZES["toy" if args.toy else "full"]
    report = Report(args.out, args.budget)
    report.data["full"] = not args.toy
    for name in args.sections:
        report.run(name, SECTIONS[name], size)
    print("\n" + table(report.data))
    failed = [n for n, r in report.data["sections"].items() if "error" in r]
    if failed:
        print(f"sections that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
