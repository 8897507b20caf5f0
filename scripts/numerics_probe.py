"""Which numeric operation gives other bits on another CPU, under ``runtime.numerics: portable``.

    python scripts/numerics_probe.py run              # this host's hashes, printed
    python scripts/numerics_probe.py run --write      # ... and committed as docs/measurements/numerics_probe/<host kind>.json
    python scripts/numerics_probe.py compare          # this host against every committed host kind (CI prints it)

The default grid's metrics differ between an Intel Xeon and an AMD EPYC under ``portable`` (README
"Reproducibility"). The whole pipeline is too coarse to say why; this probe runs, under the same pins the stages
set (params.yaml's ``runtime``), a fixed set of the operations the pipeline uses, each on fixed seeded inputs, and
records the sha256 of each result: torch's matmul and convolutions (MKL, oneDNN; and the convolution with oneDNN
switched off, torch's own kernel, the candidate replacement), batch norm, softmax / log-sum-exp, element-wise maths
(ATen's vectorised SLEEF), reductions, the optimiser steps, one training step of the pipeline's backbone, faiss's
search and k-means, numpy's and scipy's BLAS/LAPACK and ufuncs, scikit-learn's PCA (small-cluster noise), glibc's
libm (Python's ``math``), and image decode and resize (Pillow, torchvision). A host kind is the CPU's vendor, family
and model; ``compare`` prints, for every committed host kind, the operations whose bits differ from this host's:
the ones to pin or replace. It takes a few seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from noisydml import numerics  # noqa: E402  (a leaf module: loads nothing numeric)

FOLDER = REPO / "docs" / "measurements" / "numerics_probe"


def host_kind() -> str:
    """``<vendor>-<family>-<model>`` of CPU 0 (e.g. ``AuthenticAMD-25-17``, ``GenuineIntel-6-207``)."""
    info = numerics._cpuinfo()
    return "-".join(info.get(k, "unknown").replace(" ", "") for k in ("vendor_id", "cpu family", "model"))


def _digest(value) -> str:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().contiguous().cpu().numpy()
    if isinstance(value, (list, tuple)):
        return hashlib.sha256(b"".join(bytes.fromhex(_digest(v)) for v in value)).hexdigest()
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()


def _linear_backward(a, b):
    x, w = a.clone().requires_grad_(), b.clone().requires_grad_()
    import torch.nn.functional as F

    F.linear(x, w).square().sum().backward()
    return [x.grad, w.grad]


def _cdist_matmul(x, y):
    """The matmul inside ATen's cdist (its ``_euclidean_dist``), before the clamp and the square root."""
    import torch

    x_norm, y_norm = x.pow(2).sum(-1, keepdim=True), y.pow(2).sum(-1, keepdim=True)
    x_ = torch.cat([x.mul(-2), x_norm, torch.ones_like(x_norm)], -1)
    y_ = torch.cat([y, torch.ones_like(y_norm), y_norm], -1)
    return x_.matmul(y_.mT)


def probes() -> dict[str, object]:
    """Operation name -> a function returning its result (every input seeded)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    def t(*shape, seed=0):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

    def conv_backward():
        x, w = t(8, 16, 32, 32, seed=1).requires_grad_(), t(32, 16, 3, 3, seed=2).requires_grad_()
        F.conv2d(x, w, padding=1).square().sum().backward()
        return [x.grad, w.grad]

    def conv_native():
        with torch.backends.mkldnn.flags(enabled=False):
            x, w = t(8, 16, 32, 32, seed=1).requires_grad_(), t(32, 16, 3, 3, seed=2).requires_grad_()
            y = F.conv2d(x, w, padding=1)
            y.square().sum().backward()
            return [y, x.grad, w.grad]

    def batch_norm():
        x = t(32, 16, 8, 8, seed=3).requires_grad_()
        bn = torch.nn.BatchNorm2d(16)
        y = bn(x)
        y.square().sum().backward()
        return [y, x.grad, bn.running_mean, bn.running_var]

    def optimiser(kind):
        def step():
            p = torch.nn.Parameter(t(1000, seed=4))
            opt = (torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=1e-4) if kind == "sgd"
                   else torch.optim.AdamW([p], lr=1e-3, weight_decay=1e-4, fused=kind == "adamw fused"))
            for i in range(3):
                opt.zero_grad()
                (p * t(1000, seed=5 + i)).sum().backward()
                opt.step()
            return p
        return step

    def backbone_step():
        from noisydml.config import load_params
        from noisydml.models import build_model

        torch.manual_seed(0)
        train = load_params(REPO / "params.yaml", sections=["train"])["train"]
        model = build_model(train, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = t(16, 1, 32, 32, seed=6)
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return [loss] + [p.detach() for p in model.parameters()]

    def pretrain_steps(optimise: bool):
        """The pretrain stage's step at its own shapes (batch 128, 400 classes; the probe's other backbone step runs
        16 images): forward and backward only, or the stage's own loop (``pretrain_backbone``: its Adam, weight
        decay and cosine schedule) for one epoch of 3 steps on seeded images."""
        from noisydml.config import load_params
        from noisydml.engine.pretrain import HELD_OUT_PER_CLASS, pretrain_backbone
        from noisydml.models import BACKBONES

        torch.manual_seed(0)
        params = load_params(REPO / "params.yaml", sections=["train", "pretrain"])
        if optimise:  # 400 classes x (1 trained + the held-out images): 400 training images, 3 steps of 128
            labels = np.repeat(np.arange(400), 1 + HELD_OUT_PER_CLASS)
            images = np.random.default_rng(27).integers(0, 256, (len(labels), 32, 32, 1), dtype=np.uint8)
            state, _ = pretrain_backbone(params["train"], {**params["pretrain"], "epochs": 1}, images, labels,
                                         progress=False)
            return list(state.values())
        backbone = BACKBONES[params["train"]["backbone"]](1, params["train"])
        model = torch.nn.Sequential(backbone, torch.nn.Linear(backbone.out_dim, 400))
        x = t(128, 1, 32, 32, seed=27)
        y = torch.from_numpy(np.random.default_rng(28).integers(0, 400, 128))
        F.cross_entropy(model(x), y).backward()
        return [p.grad for p in model.parameters()]

    def faiss_search():
        import faiss

        rng = np.random.default_rng(7)
        base = rng.standard_normal((4000, 64)).astype("float32")
        index = faiss.IndexFlatL2(64)
        index.add(base)
        distances, ids = index.search(base[:500], 10)
        return [distances, ids]

    def faiss_kmeans():
        import faiss

        x = np.random.default_rng(8).standard_normal((4000, 32)).astype("float32")
        km = faiss.Kmeans(32, 50, niter=10, seed=0)
        km.train(x)
        return km.centroids

    def numpy_ops(kind):
        rng = np.random.default_rng(9)
        a, b = rng.standard_normal((300, 200)).astype("float32"), rng.standard_normal((200, 150)).astype("float32")
        return {"matmul": lambda: a @ b, "matmul64": lambda: a.astype("float64") @ b.astype("float64"),
                "ufuncs": lambda: [np.exp(a), np.log(np.abs(a) + 1), np.power(np.abs(a), 1.7), np.tanh(a)],
                "reductions": lambda: [a.sum(0), a.mean(), np.linalg.norm(a, axis=1), np.cumsum(a.ravel())],
                "eigh": lambda: np.linalg.eigh((a.T @ a).astype("float64"))[0]}[kind]

    def scipy_svd():
        from scipy import linalg

        a = np.random.default_rng(10).standard_normal((200, 100))
        return linalg.svd(a, compute_uv=False)

    def sklearn_pca():
        from sklearn.decomposition import PCA

        a = np.random.default_rng(11).standard_normal((1000, 256)).astype("float32")
        return PCA(32, random_state=0).fit_transform(a)

    def libm():
        xs = [0.001 * i - 7.0 for i in range(20000)]
        out = [math.exp(x) for x in xs] + [math.log(abs(x) + 1e-3) for x in xs] + [math.pow(abs(x), 1.37) for x in xs]
        out += [math.sin(x) for x in xs] + [math.atan2(x, 1.3) for x in xs]
        return np.array(out)

    def image_decode_resize():
        from PIL import Image

        pixels = (np.random.default_rng(12).random((64, 64, 3)) * 255).astype("uint8")
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        decoded = Image.open(io.BytesIO(buffer.getvalue()))
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        jpeg = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
        return [np.asarray(decoded), jpeg, np.asarray(decoded.resize((32, 32), Image.BILINEAR)),
                np.asarray(decoded.resize((48, 48), Image.BICUBIC))]

    def synthetic_faces():
        from noisydml.data import faces

        views = [faces.nuisance(faces._rng(7, k), mode) for k, mode in enumerate(("frontal", "profile", "frontal"))]
        return [faces.render(faces.identity("train", k), view, 32) for k, view in enumerate(views)]

    def tensor_resize():
        from torchvision.transforms import functional as TF

        x = t(2, 3, 64, 64, seed=13)
        return [TF.resize(x, [32, 32], antialias=True), F.interpolate(x, size=(40, 40), mode="bilinear")]

    a, b = t(256, 256, seed=20), t(256, 256, seed=21)
    return {
        "torch matmul 256 (MKL sgemm)": lambda: a @ b,
        "torch matmul 64x100x33": lambda: t(64, 100, seed=22) @ t(100, 33, seed=23),
        "torch bmm": lambda: torch.bmm(t(4, 50, 70, seed=24), t(4, 70, 30, seed=25)),
        "torch linear backward": lambda: _linear_backward(a, b),
        "conv2d forward (oneDNN)": lambda: F.conv2d(t(8, 16, 32, 32, seed=1), t(32, 16, 3, 3, seed=2), padding=1),
        "conv2d backward (oneDNN)": conv_backward,
        "conv2d forward+backward, oneDNN off (torch's own)": conv_native,
        "batch norm forward+backward": batch_norm,
        "softmax / log_softmax / logsumexp": lambda: [a.softmax(1), a.log_softmax(1), a.logsumexp(1)],
        "exp / log / pow / tanh / sigmoid / erf (ATen)": lambda: [a.exp(), a.abs().log1p(), a.abs().pow(1.7), a.tanh(),
                                                                 a.sigmoid(), torch.erf(a)],
        "sum / mean / norm reductions (ATen)": lambda: [t(1000, 1000, seed=26).sum(), a.mean(0), a.norm(dim=1),
                                                        a.cumsum(1)],
        "normalize + cdist": lambda: torch.cdist(F.normalize(a, dim=1), F.normalize(b, dim=1)),
        # cdist's pieces (pytorch-metric-learning's LpDistance calls cdist): past 25 rows ATen computes it as one
        # matmul of [-2x, |x|^2, 1] by [y, 1, |y|^2] (inner size 258 here), then clamp and sqrt; the probe had only
        # the whole until an Intel host showed it differs from the AMD one while "torch matmul 256" does not
        "cdist's matmul, inner size 258 (MKL sgemm)": lambda: _cdist_matmul(F.normalize(a, dim=1),
                                                                             F.normalize(b, dim=1)),
        "cdist without its matmul (ATen's own kernel)": lambda: torch.cdist(
            F.normalize(a, dim=1), F.normalize(b, dim=1), compute_mode="donot_use_mm_for_euclid_dist"),
        "sqrt / clamp (ATen)": lambda: [a.abs().sqrt(), a.clamp_min(0.1)],
        "acos / cos / sin (ATen; ArcFace's margin)": lambda: [a.tanh().acos(), a.cos(), a.sin()],
        "SGD momentum steps": optimiser("sgd"),
        "AdamW steps": optimiser("adamw"),
        # the default (foreach) AdamW takes its square root through MKL's vector maths (vmsSqrt, under gdb), whose
        # kernel MKL picks by CPU; the fused one through ATen's own vector code, which the capability pin fixes
        "AdamW steps, fused (no MKL vector maths)": optimiser("adamw fused"),
        "backbone: one training step (train.backbone)": backbone_step,
        "pretrain: forward + backward at its batch of 128": lambda: pretrain_steps(False),
        "pretrain: its loop, 3 Adam steps at its batch of 128": lambda: pretrain_steps(True),
        "faiss IndexFlatL2 search": faiss_search,
        "faiss k-means": faiss_kmeans,
        "numpy matmul float32 (OpenBLAS)": numpy_ops("matmul"),
        "numpy matmul float64 (OpenBLAS)": numpy_ops("matmul64"),
        "numpy exp / log / power / tanh": numpy_ops("ufuncs"),
        "numpy reductions": numpy_ops("reductions"),
        "numpy eigh (LAPACK)": numpy_ops("eigh"),
        "scipy svd": scipy_svd,
        "scikit-learn PCA": sklearn_pca,
        "glibc libm (Python math)": libm,
        "image decode (PNG, JPEG) and resize (Pillow)": image_decode_resize,
        "tensor resize (torchvision, interpolate)": tensor_resize,
        "synthetic faces: render (Pillow draw, blur, transform, Lanczos)": synthetic_faces,
    }


def run() -> dict:
    """This host's probe: its kind, what the libraries took, and each operation's hash."""
    import yaml

    runtime = yaml.safe_load((REPO / "params.yaml").read_text())["runtime"]
    numerics.pin(runtime)
    import torch  # noqa: F401  (loaded after the pins)

    hashes, started = {}, time.perf_counter()
    for name, op in probes().items():
        hashes[name] = _digest(op())[:16]
    fingerprint = numerics.host_fingerprint(runtime)
    return {"host_kind": host_kind(), "cpu": fingerprint["cpu"], "libc": fingerprint["libc"],
            "packages": fingerprint["packages"], "numerics": runtime["numerics"], "threads": runtime["threads"],
            "taken": {k: v for k, v in numerics.verify(runtime).items() if k != "pools"},
            "seconds": round(time.perf_counter() - started, 1), "ops": hashes}


def compare(mine: dict) -> list[str]:
    """Lines: for every committed host kind but this one, the operations whose hashes differ."""
    lines = []
    for path in sorted(FOLDER.glob("*.json")):
        other = json.loads(path.read_text())
        if other["host_kind"] == mine["host_kind"]:
            same = [op for op, h in mine["ops"].items() if other["ops"].get(op) != h]
            lines.append(f"{other['host_kind']} (this host's kind, committed): "
                         + ("every operation the same" if not same else f"differs in {', '.join(same)}"))
            continue
        shared = [op for op in mine["ops"] if op in other["ops"]]  # an op one probe lacks decides nothing
        differ = [op for op in shared if other["ops"][op] != mine["ops"][op]]
        unshared = len(mine["ops"]) - len(shared)
        versions = {k for k in mine["packages"] if other["packages"].get(k) != mine["packages"][k]}
        lines.append(f"{other['host_kind']} ({other['cpu']['model']}): {len(differ)} of the {len(shared)} "
                     "operations both probes hold differ" + (": " + "; ".join(differ) if differ else "")
                     + (f" ({unshared} of this probe's not in that one: run it there with --write)" if unshared else "")
                     + (f" (other package versions: {', '.join(sorted(versions))})" if versions else ""))
    if not lines:
        lines.append("no committed probe of any host kind in " + str(FOLDER.relative_to(REPO)))
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "compare"))
    parser.add_argument("--write", action="store_true", help="run: commit this host kind's probe file")
    args = parser.parse_args(argv)
    mine = run()
    print(f"numerics probe on {mine['host_kind']} ({mine['cpu']['model']}), {mine['numerics']}, "
          f"{mine['threads']} threads, {mine['seconds']} s")
    if args.command == "run":
        for op, h in mine["ops"].items():
            print(f"  {h}  {op}")
        if args.write:
            FOLDER.mkdir(parents=True, exist_ok=True)
            path = FOLDER / f"{mine['host_kind']}.json"
            path.write_text(json.dumps(mine, indent=1) + "\n")
            print(f"wrote {path.relative_to(REPO)}")
        return
    for line in compare(mine):
        print("  " + line)


if __name__ == "__main__":
    main()
