"""A paper profile at its benchmark's real size, on this CPU, part by part: what each part of a training step and of
the run's periodic work costs in time and host memory when the data, the method's state and the evaluation have
the real counts.

    python scripts/rehearse_full_size.py prism/table1_sop             # one profile (its largest run by GPU memory)
    python scripts/rehearse_full_size.py --all                        # every profile (the parts shared are reused)
    python scripts/rehearse_full_size.py --table                      # the docs table from the saved results
    python scripts/rehearse_full_size.py --faces-series 100000 1000000 # MS1MV0's data path at 0.1M and 1M images

A rehearsal (``noisydml profile rehearse``) runs a profile's exact overrides through ``dvc exp run`` on miniatures;
this runs the profile's real backbone, batch, method and memories on synthetic data at the real counts, where a
whole run would take this CPU weeks. Each part runs in a fresh process (its peak memory is its own):

1. **data**: synthetic images at the benchmark's counts (training and test images, classes or identities) and a
   typical resolution, stored as the real data is (JPEG files listed by a CSV; for faces insightface's RecordIO at
   112 px), made once and cached (``--cache``; 64 distinct encodings written to every file: the reading is what is
   measured, not the pictures), then the real prepare stage's code (every file verified; the face set's release
   check and record index).
2. **loader**: ``--steps`` P x K batches of the real sampler through the real input pipeline (the profile's
   transforms; this machine's cores as loader workers).
3. **network**: the profile's backbone and head, random weights, forward + backward + optimiser step on decoded
   inputs, at the per-process batch or the largest that fits this machine's memory (the time scaled to the batch,
   said so), and the activations kept for backward per image.
4. **method**: the run's method built at the real size (its memories, banks, per-row state allocated), its
   periodic work on a class-structured bank of the real size (SGM for the SGPS family, with the round's labels then
   in use) and ``--steps`` steps of its loss and backward on the batch's embeddings (with forwarded positives where
   the method asks for them).
5. **evaluation**: the real retrieval metrics on class-structured embeddings of the real test size; for face
   profiles the IJB-C protocol (template pooling, every template pair scored, TAR at FAR) at IJB-C's size.

Results: ``docs/measurements/full_size/<profile>.json`` (and the host's CPU); ``--table`` prints the table of
docs/profiles.md. The GPU memory, disk and hours beside them are ``noisydml profile plan``'s (tensor sizes and the
H100 rates).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

OUT = REPO / "docs" / "measurements" / "full_size"
#: Ours: a typical image of each benchmark (width, height) in its files; the decode cost follows it.
RESOLUTION = {"cub200": (500, 375), "cars196": (700, 470), "sop": (500, 500), "inshop": (256, 256),
              "food101n": (512, 512), "cars98n": (700, 470), "clothing1m": (400, 400)}
#: IJB-C's 1:1 protocol as insightface's meta files give it (as we recall them: 469,375 images, 23,124 templates,
#: 15,658,489 template pairs of which 19,557 genuine).
IJBC = {"images": 469_375, "templates": 23_124, "pairs": 15_658_489, "genuine": 19_557}
#: This machine's memory the network part may fill with activations (bytes).
ACTIVATION_BUDGET = 8 * 2**30


# ----------------------------------------------------------------------------------------------- measuring
class Peak:
    """The process's peak resident memory while a block runs (sampled every 0.1 s), in MiB."""

    def __enter__(self) -> "Peak":
        self.peak, self._stop = self.now(), threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()
        self.t0 = time.perf_counter()
        return self

    @staticmethod
    def now() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.now())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.seconds = time.perf_counter() - self.t0
        self.peak = max(self.peak, self.now())


def cpu_name() -> str:
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                key, value = (x.strip() for x in line.split(":", 1))
                fields.setdefault(key, value)
    return (f"{fields.get('model name', '?')}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}, "
            f"{os.cpu_count()} cores")


# ----------------------------------------------------------------------------------------------- the profile's run
def largest_run(profile: str):
    """The profile's params (after its overrides) and its run with the most GPU memory (noisydml profile plan)."""
    from noisydml.tools.plan import profile_plan
    from noisydml.tools.profiles import load_profiles, params_after
    from noisydml.runs import runs_of

    params = params_after(load_profiles()[profile]["set"])
    plan = profile_plan(profile, params)
    chosen = plan.largest("gpu")
    run = next(r for r in runs_of(params) if f"{r.dataset}/{r.noise}/{r.name}" == chosen.run)
    return params, run, plan


def dataset_counts(params: dict, dataset: str) -> dict:
    from noisydml.data.benchmarks import BENCHMARKS
    from noisydml.tools.plan import _classes
    from noisydml.tools.profiles import _images

    cfg = params["datasets"][dataset]
    train, test = _images(params, dataset)
    counts = {"kind": cfg["kind"], "train_images": train, "test_images": test, "train_classes": _classes(params, dataset)}
    if cfg["kind"] in BENCHMARKS:
        official = BENCHMARKS[cfg["kind"]].official_counts(cfg)
        counts["test_classes"] = official.get("test_classes", official.get("query_classes", 0))
    else:
        counts["test_classes"] = int(cfg.get("test_identities", 100))
    return counts


# ----------------------------------------------------------------------------------------------- 1. data
def jpeg_pool(size: tuple[int, int], count: int = 64) -> list[bytes]:
    import io

    import numpy as np
    from PIL import Image

    pool = []
    for k in range(count):
        y, x = np.mgrid[0:size[1], 0:size[0]]
        rgb = np.stack([(x * (k + 1) + y) % 256, (y * (k + 3)) % 256, (x + y * (k + 5)) % 256], -1).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format="JPEG", quality=85)
        pool.append(buf.getvalue())
    return pool


def make_files(folder: Path, counts: dict) -> Path:
    """``folder/images/*.jpg`` and ``folder/list.csv`` (path,label,split) at the counts; returns the CSV."""
    csv = folder / "list.csv"
    if csv.is_file():
        return csv
    pool = jpeg_pool(RESOLUTION.get(counts["kind"], (500, 500)))
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = ["path,label,split"]
    n = 0
    for split, images, classes in (("train", counts["train_images"], counts["train_classes"]),
                                   ("test", counts["test_images"], counts["test_classes"])):
        offset = 0 if split == "train" else counts["train_classes"]
        for i in range(images):
            name = f"images/{n // 10000:03d}/{n}.jpg"
            path = folder / name
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(pool[n % len(pool)])
            rows.append(f"{name},c{offset + i % classes},{split}")
            n += 1
    tmp = csv.with_suffix(".tmp")
    tmp.write_text("\n".join(rows) + "\n")
    tmp.replace(csv)
    return csv


def make_records(folder: Path, images: int, identities: int) -> Path:
    """insightface's ``train.rec`` at the counts (identities of near-equal size, the last 100 held out for P@1)."""
    import numpy as np

    from noisydml.data.face_formats import write_face_recordio

    if (folder / "train.idx").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    pool = jpeg_pool((112, 112))
    labels = np.sort(np.arange(images) % identities)
    write_face_recordio(folder, labels, [pool[i % len(pool)] for i in range(images)])
    return folder


def part_data(profile: str, cache: Path, faces_images: int | None) -> dict:
    from noisydml.data.registry import check_dataset, prepare_dataset

    params, run, _ = largest_run(profile)
    counts = dataset_counts(params, run.dataset)
    out = {"counts": counts}
    if counts["kind"] == "faces":
        images = faces_images or counts["train_images"]
        identities = min(counts["train_classes"] + 100, images // 2)
        with Peak() as made:
            source = make_records(cache / f"faces_{images}", images, identities)
        cfg = {"kind": "faces", "source": "local", "local_dir": str(source), "release": "unchecked",
               "storage": "records", "image_size": 112, "test_identities": 100}
        out.update(series_images=images, series_identities=identities)
    else:
        with Peak() as made:
            csv = make_files(cache / counts["kind"], counts)
        cfg = {"kind": "folder", "csv": str(csv), "storage": "files", "root": ""}
    params = {"datasets": {"full": cfg}}
    cfg = check_dataset(params, "full")
    prepared = cache / "prepared" / (f"faces_{faces_images}" if counts["kind"] == "faces" else counts["kind"])
    with Peak() as prep:
        if not (prepared / "info.json").is_file():
            prepare_dataset("full", cfg, prepared, REPO, workers=os.cpu_count() or 1)
    disk = sum(p.stat().st_size for p in (cache / (f"faces_{faces_images}" if counts["kind"] == "faces"
                                                   else counts["kind"])).rglob("*") if p.is_file())
    out.update(generate_s=made.seconds, prepare_s=prep.seconds, prepare_peak_mib=prep.peak, data_disk_bytes=disk,
               prepared=str(prepared))
    return out


# ----------------------------------------------------------------------------------------------- 2-5
def _load(prepared: str):
    from noisydml.data.prepared import PreparedDataset, train_split

    return train_split(Path(prepared), REPO)


def part_loader(profile: str, prepared: str, steps: int) -> dict:
    import numpy as np
    import torch

    from noisydml.data.images import InputPipeline
    from noisydml.engine.sampling import epoch_batches

    params, run, _ = largest_run(profile)
    train_cfg = run.params(params)["train"]
    with Peak() as index:
        ds, train, labels = _load(prepared)
    images = ds.images[train["sample_id"].to_numpy()]
    batch = train_cfg["batch"]["classes"] * train_cfg["batch"]["per_class"]
    per_process = batch // int(params["runtime"]["processes"])
    workers = max(0, (os.cpu_count() or 1))
    pipe = InputPipeline.from_params(train_cfg, {**params["runtime"], "loader_workers": workers}, 0)
    batches = epoch_batches(labels, train_cfg["batch"]["per_class"], batch, 0, 0)[:steps + 1]
    rows = [b[:per_process] for b in batches]
    it = pipe.train_batches(images, rows, 0)
    next(it)  # the workers started
    with Peak() as loading:
        for x in it:
            shape = tuple(x.shape)
    torch.set_num_threads(1)
    return {"index_s": index.seconds, "index_peak_mib": index.peak, "loader_s_per_batch": loading.seconds / steps,
            "loader_peak_mib": loading.peak, "batch_shape": shape, "loader_workers": workers,
            "images_per_s": per_process * steps / loading.seconds}


def _device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def _gpu_peak(device) -> dict:
    import torch

    if device.type != "cuda":
        return {}
    return {"gpu_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def part_network(profile: str, prepared: str, steps: int, device_name: str = "cpu") -> dict:
    import numpy as np
    import torch

    from noisydml.data.images import InputPipeline
    from noisydml.engine.optim import build_optimizer
    from noisydml.engine.sampling import epoch_batches
    from noisydml.models import build_model
    from noisydml.tools.plan import activation_bytes_per_image

    params, run, _ = largest_run(profile)
    run_params = run.params(params)
    train_cfg = run_params["train"]
    ds, train, labels = _load(prepared)
    images = ds.images[train["sample_id"].to_numpy()]
    batch = train_cfg["batch"]["classes"] * train_cfg["batch"]["per_class"]
    hp = run_params["methods"][run.method]
    # the images a step forwards with gradient: the batch, and SGPS's forwarded positives (K per item)
    forwarded = 1 + int(hp["positives_per_sample"]) if hp.get("positive_source") == "forward" else 1
    per_process = forwarded * batch // int(params["runtime"]["processes"])
    side = int(train_cfg["input"]["crop"]) if ds.stored_as_files else int(ds.info["image_shape"][0])
    per_image = activation_bytes_per_image(train_cfg, side)
    device = _device(device_name)
    budget = ACTIVATION_BUDGET if device.type == "cpu" else 0.6 * torch.cuda.get_device_properties(device).total_memory
    run_batch = max(2, min(per_process, int(budget // per_image)))
    pipe = InputPipeline.from_params(train_cfg, {**params["runtime"], "loader_workers": 0}, 0)
    rows = [np.resize(b, run_batch) for b in epoch_batches(labels, train_cfg["batch"]["per_class"], batch, 0, 0)[:steps + 1]]
    inputs = list(pipe.train_batches(images, rows, 0))
    torch.manual_seed(0)
    model = build_model({**train_cfg, "pretrained": "none"}, in_channels=3).train().to(device)
    inputs = [x.to(device) for x in inputs]

    class NoMethod:  # the network's own groups only: the method's part is measured on its own
        def head_lr_factor(self):
            return 1.0

        def param_groups(self, lr, weight_decay):
            return []

    optimizer = build_optimizer(model, NoMethod(), train_cfg["optimizer"])
    with Peak() as first:  # one step first: the allocator and the kernels' workspaces
        emb, _ = model.forward_with_features(inputs[0])
        emb.square().sum().backward()
        optimizer.step()
    with Peak() as timed:
        for x in inputs[1:]:
            optimizer.zero_grad(set_to_none=True)
            emb, _ = model.forward_with_features(x)
            emb.square().sum().backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - timed.t0) / steps
    return {"network_batch_run": run_batch, "network_batch": per_process, "forwarded_factor": forwarded, "side": side,
            "network_s_per_step": seconds * per_process / run_batch, "network_measured_s_per_step": seconds,
            "network_peak_mib": max(first.peak, timed.peak), "activation_mib_per_image": per_image / 2**20,
            "device": str(device), **_gpu_peak(device)}


def part_method(profile: str, steps: int, sgm_max_rows: int, device_name: str = "cpu",
                rows: int = 0, identities: int = 0) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from noisydml.methods import build_method
    from noisydml.methods.base import Batch, MethodServices, MethodSetup
    from noisydml.methods.parts.sgm import run_sgm
    from noisydml.models import build_model
    from noisydml.engine.sampling import epoch_batches

    torch.set_num_threads(os.cpu_count() or 1)
    params, run, _ = largest_run(profile)
    run_params = run.params(params)
    train_cfg, hp = run_params["train"], run_params["methods"][run.method]
    counts = dataset_counts(params, run.dataset)
    n, classes, dim = counts["train_images"], counts["train_classes"], train_cfg["embedding_dim"]
    if rows:  # a face series' size: the method's state at that many rows and identities
        n, classes = rows, identities
    rng = np.random.default_rng(0)
    labels = np.sort(np.arange(n) % classes).astype(np.int64)

    device = _device(device_name)
    side = (int(params["datasets"][run.dataset]["image_size"]) if counts["kind"] == "faces"
            else int(train_cfg["input"]["crop"]))

    class Services(MethodServices):  # a peer network, and the batch's rows through it (random inputs: the cost)
        def build_network(self):
            return build_model({**train_cfg, "pretrained": "none"}, in_channels=3).to(device)

        def forward(self, batch, network=None, transform=None):
            inputs = torch.randn(len(batch.index), 3, side, side, device=device)
            return network.forward_with_features(inputs)

    with torch.device("meta"):
        feature_dim = int(getattr(build_model({**train_cfg, "pretrained": "none"}, in_channels=3).backbone,
                                  "out_dim", dim))
    out: dict = {"method": run.method, "rows": n, "classes": classes, "device": str(device)}
    with Peak() as built:
        method = build_method(run.method, MethodSetup(
            hparams=hp, num_classes=classes, embedding_dim=dim, dataset_size=n, train_labels=labels, seed=0,
            feature_dim=feature_dim, sample_ids=np.arange(n), services=Services())).to(device)
    tensors = sorted(((name, t.numel() * t.element_size()) for name, t in
                      [*method.named_buffers(), *method.named_parameters()]), key=lambda x: -x[1])
    out.update(build_s=built.seconds, build_peak_mib=built.peak,
               largest_tensors={name: size for name, size in tensors[:5]})
    if "sgm" in hp:  # the periodic work: a round on a class-structured bank of the real size
        centres = F.normalize(torch.randn(classes, dim), dim=1)
        with Peak() as bank:
            features = F.normalize(centres[torch.from_numpy(labels)] + 0.6 * torch.randn(n, dim), dim=1)
            method.bank.copy_(features.to(device))
        out["bank_peak_mib"] = bank.peak
        if n <= sgm_max_rows:
            with Peak() as sgm:
                result = run_sgm(method.bank.cpu().numpy(), labels, hp["sgm"], np.random.default_rng(0),
                                 top_down_labels=method._uses()[1], use_gpu=device.type == "cuda")
            bottom, top = result.bottom_up, result.top_down
            out.update(sgm_s=sgm.seconds, sgm_peak_mib=sgm.peak, sgm_subgroups=int(result.stats["subgroups"]))
        else:  # its exact k-NN search would take this CPU hours: the SGM series measures it; the loss still runs
            bottom = top = labels  # with the classes as subgroups, so L_noise and its positives are exercised
            out["sgm_skipped"] = f"{n:,} rows > --sgm-max-rows {sgm_max_rows:,} (see bench_faces_scale.py --series)"
        method.bottom_up_labels.copy_(torch.from_numpy(bottom))
        method.top_down_labels.copy_(torch.from_numpy(top))
        method.sgm_round += 1
        method._set_pools()
    batch = train_cfg["batch"]["classes"] * train_cfg["batch"]["per_class"]
    batches = epoch_batches(labels, train_cfg["batch"]["per_class"], batch, 0, 0)[:steps + 1]
    centres = F.normalize(torch.randn(classes, dim), dim=1)

    def embeddings(rows):
        e = F.normalize(centres[torch.from_numpy(labels[rows])] + 0.6 * torch.randn(len(rows), dim), dim=1)
        return e.to(device).requires_grad_(True)

    def features(rows):
        return torch.randn(len(rows), feature_dim, device=device, requires_grad=True)

    def index(rows):
        return torch.from_numpy(np.asarray(rows)).to(device)

    method.train()
    with Peak() as stepping:
        for step, rows in enumerate(batches):
            if step == 1:
                t0 = time.perf_counter()
            request = method.extra_samples(rows, 0, step)
            extra = None
            if request is not None:
                extra_rows = np.asarray(request.rows)
                extra = Batch(embeddings(extra_rows), features(extra_rows), index(labels[extra_rows]),
                              index(extra_rows), index(extra_rows), step, 0, request=request)
            e = embeddings(rows)
            b = Batch(e, features(rows), index(labels[rows]), index(rows), index(rows), step, 0, extra=extra)
            loss, _ = method.loss(b)
            loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out.update(method_s_per_step=(time.perf_counter() - t0) / steps, method_peak_mib=stepping.peak, **_gpu_peak(device))
    return out


def part_evaluation(profile: str) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from noisydml.evaluation.retrieval import retrieval_metrics

    params, run, _ = largest_run(profile)
    counts = dataset_counts(params, run.dataset)
    dim = run.params(params)["train"]["embedding_dim"]
    torch.manual_seed(0)
    out = {}
    if counts["kind"] == "faces":
        from noisydml.evaluation.verification import pair_scores, tar_at_far, template_features

        rng = np.random.default_rng(0)
        with Peak() as ijb:
            templates = np.sort(rng.integers(0, IJBC["templates"], IJBC["images"]))
            media = templates * 4 + rng.integers(0, 4, IJBC["images"])
            owner = np.arange(IJBC["templates"]) // 4
            feats = (F.normalize(torch.randn(IJBC["templates"] // 4 + 1, dim), dim=1)[owner[templates]]
                     + 0.7 * torch.randn(IJBC["images"], dim)).numpy()
            ids, pooled = template_features(feats, templates, media)
            t1 = rng.integers(0, len(ids), IJBC["pairs"])
            t2 = rng.integers(0, len(ids), IJBC["pairs"])
            t2[: IJBC["genuine"]] = np.minimum(t1[: IJBC["genuine"]] ^ 1, len(ids) - 1)
            scores = pair_scores(ids, pooled, ids[t1], ids[t2])
            labels = np.zeros(IJBC["pairs"], np.int64)
            labels[: IJBC["genuine"]] = 1
            tar_at_far(scores, labels)
        out.update(ijb_s=ijb.seconds, ijb_peak_mib=ijb.peak)
    test, classes = counts["test_images"], max(counts["test_classes"], 1)
    if counts["kind"] == "faces":
        test = 100 * 10  # the held-out identities' retrieval split: 100 identities (their images at ~10 each)
    labels = np.arange(test) % classes
    centres = F.normalize(torch.randn(classes, dim), dim=1)
    with Peak() as ev:
        emb = F.normalize(centres[torch.from_numpy(labels)] + 0.6 * torch.randn(test, dim), dim=1)
        metrics = retrieval_metrics(emb, labels, max_k=int(params["evaluate"]["max_k"]), nmi=True)
    out.update(evaluation_s=ev.seconds, evaluation_peak_mib=ev.peak, evaluation_rows=test,
               precision_at_1=metrics["precision_at_1"])
    return out


# ----------------------------------------------------------------------------------------------- driver
def run_part(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--part", *args], capture_output=True, text=True, cwd=REPO)
    if out.returncode:
        raise RuntimeError(f"part {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rehearse(profile: str, cache: Path, steps: int, faces_images: int | None = None,
             sgm_max_rows: int = 400_000, device: str = "cpu", only: list[str] | None = None) -> dict:
    from noisydml.tools.plan import GIB

    params, run, plan = largest_run(profile)
    if params["datasets"][run.dataset]["kind"] == "faces" and not faces_images:
        print(f"{profile}: a face profile's 10M images would not fit this disk; its data path is measured by "
              "--faces-series (a few sizes), the rest by noisydml profile plan", flush=True)
        return {}
    t0 = time.perf_counter()
    result = {"profile": profile, "run": f"{run.dataset}/{run.noise}/{run.name}", "cpu": cpu_name(),
              "steps_measured": steps, "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                                                capture_output=True, text=True).stdout.strip()}
    print(f"{profile}: {result['run']}", flush=True)
    name = profile.replace("/", "-") + (f"-{faces_images}" if faces_images else "") + (
        "" if device == "cpu" else f"-{device}")
    saved = json.loads((OUT / f"{name}.json").read_text()) if only and (OUT / f"{name}.json").is_file() else {}
    data = saved.get("data") or run_part("data", profile, str(cache), str(faces_images or 0))
    print(f"  data: {json.dumps(data)}", flush=True)
    result = {**saved, **result, "data": data}
    for name_, args in (("loader", (data["prepared"], str(steps))),
                       ("network", (data["prepared"], str(steps), device)),
                       ("method", (str(steps), str(sgm_max_rows), device, str(data.get("series_images", 0)),
                                   str(data.get("series_identities", 0) - 100 if "series_images" in data else 0))),
                       ("evaluation", ())):
        if only and name_ not in only and name_ in result:
            continue
        result[name_] = run_part(name_, profile, *args)
        print(f"  {name_}: {json.dumps(result[name_])}", flush=True)
    result["plan"] = {"gpu_gib": plan.largest("gpu").total("gpu") / GIB, "host_gib": plan.host_needed() / GIB,
                      "disk_gb": plan.disk_needed() / 1e9, "hours": plan.hours, "misfits": plan.misfits(),
                      "steps": plan.largest("gpu").steps}
    result["seconds"] = time.perf_counter() - t0
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _images_cell(network: dict) -> str:
    """The images a step forwards per process, how they come about and at how many the time was measured."""
    factor = network.get("forwarded_factor", 1)
    text = f"{network['network_batch']}" + (f" = {network['network_batch'] // factor} x {factor}" if factor > 1 else "")
    if network["network_batch_run"] != network["network_batch"]:
        text += f"; measured at {network['network_batch_run']}, scaled"
    return text


def table() -> str:
    rows = ["| profile (largest run) | images / classes (train; test) | steps | peak host memory here (part) | "
            "seconds per step here: loader, network (batch), method | periodic work here | evaluation here "
            "(test rows) | GPU memory (plan) | disk (plan) | H100 hours (plan) | fits |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(OUT.glob("*.json")):
        r = json.loads(path.read_text())
        c = r["data"]["counts"]
        parts = {"prepare": r["data"]["prepare_peak_mib"], "loader": r["loader"]["loader_peak_mib"],
                 "network": r["network"]["network_peak_mib"], "method": r["method"].get("method_peak_mib", 0),
                 "SGM": r["method"].get("sgm_peak_mib", 0), "evaluation": r["evaluation"]["evaluation_peak_mib"],
                 "IJB-C": r["evaluation"].get("ijb_peak_mib", 0)}
        top = max(parts, key=parts.get)
        images = (f"{r['data']['series_images']:,} of {c['train_images']:,} (series) / "
                  f"{r['data']['series_identities'] - 100:,} of {c['train_classes']:,}"
                  if "series_images" in r["data"] else f"{c['train_images']:,} / {c['train_classes']:,}")
        periodic = (f"SGM {r['method']['sgm_s']:.0f} s, {r['method']['sgm_peak_mib'] / 1024:.1f} GiB"
                    if "sgm_s" in r["method"] else "SGM: the series (below)" if "sgm_skipped" in r["method"] else "-")
        ijb = (f"; IJB-C {r['evaluation']['ijb_s']:.0f} s" if "ijb_s" in r["evaluation"] else "")
        plan = r["plan"]
        rows.append(
            f"| `{r['profile']}` ({r['run']}) | {images}; {c['test_images']:,} | {plan['steps']:,} | "
            f"{parts[top] / 1024:.1f} GiB ({top}) | {r['loader']['loader_s_per_batch']:.2f}, "
            f"{r['network']['network_s_per_step']:.1f} ({_images_cell(r['network'])}), "
            f"{r['method']['method_s_per_step']:.3f} | {periodic} | {r['evaluation']['evaluation_s']:.0f} s "
            f"({r['evaluation']['evaluation_rows']:,}){ijb} | {plan['gpu_gib']:.1f} GiB | {plan['disk_gb']:,.0f} GB | "
            f"{plan['hours']:,.1f} | {'yes' if not plan['misfits'] else '**no**'} |")
    cpus = sorted({json.loads(p.read_text())["cpu"] for p in OUT.glob("*.json")})
    return "\n".join(rows) + f"\n\nMeasured on: {'; '.join(cpus)}.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", nargs="?")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--faces-series", type=int, nargs="+", metavar="IMAGES")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sgm-max-rows", type=int, default=400_000,
                        help="above this many rows SGM is not run here (its k-NN search is quadratic)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "noisydml" / "full_size")
    parser.add_argument("--device", default="cpu", help="the network's and the method's device: cpu | cuda | auto "
                                                         "(the data, loader and evaluation parts run on the CPU)")
    parser.add_argument("--only", nargs="+", choices=("loader", "network", "method", "evaluation"),
                        help="re-run these parts of the profile's saved result (the data part is cached)")
    parser.add_argument("--part", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        name, profile, *rest = args.part
        out = {"data": lambda: part_data(profile, Path(rest[0]), int(rest[1]) or None),
               "loader": lambda: part_loader(profile, rest[0], int(rest[1])),
               "network": lambda: part_network(profile, rest[0], int(rest[1]), rest[2]),
               "method": lambda: part_method(profile, int(rest[0]), int(rest[1]), rest[2], int(rest[3]),
                                             int(rest[4])),
               "evaluation": lambda: part_evaluation(profile)}[name]()
        print(json.dumps(out, default=str))
        return
    if args.table:
        print(table())
        return
    if args.faces_series:
        for images in args.faces_series:
            rehearse(args.profile or "sgps/table4_pairwise", args.cache, args.steps, images, args.sgm_max_rows,
                     args.device)
        return
    from noisydml.tools.profiles import load_profiles

    for profile in (list(load_profiles()) if args.all else [args.profile]):
        rehearse(profile, args.cache, args.steps, sgm_max_rows=args.sgm_max_rows, device=args.device,
                 only=args.only)


if __name__ == "__main__":
    main()
