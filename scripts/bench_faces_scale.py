"""How DCQ + SGPS's per-run state and per-step work grow with the number of identities: measured on synthetic
512-d embeddings at a few class counts on this machine, then extrapolated to MS1MV0 (10M images, 100K identities).

    python scripts/bench_faces_scale.py                          # 1,000 / 2,000 / 4,000 identities x 20 images
    python scripts/bench_faces_scale.py --classes 500 1000 --images-per-class 10
    python scripts/bench_faces_scale.py --series 1 2 4           # 100K identities x 1 / 2 / 4 images: SGM by part

Per class count, each part in a fresh process (its peak RSS is its own): SGM's pass (Algs. 1, 2 and 3-4, the
``dcq_sgps`` defaults: one synchronous round per epoch here, the paper's asynchronous server), the PCS memory's
class-centre sums (``classes x d`` float64) and one step of PCS + Eq. 18 against a full class queue of 8,192 keys
(batch 512). Prints seconds and peak MiB per part, then the fitted growth (a power law in the class count) and
its extrapolation, with the sizes that need no measurement: the feature bank (``N x d`` float32), the queue.

``--series``: MS1MV0's 100K identities at a few images each, SGM's three parts (Alg. 1, Alg. 2, Algs. 3-4) each
with its seconds and the process's peak memory while it ran (sampled every 0.2 s), one fresh process per size;
then how each grows with the rows.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DIM, QUEUE, BATCH = 512, 8192, 512
MS1MV0_IMAGES, MS1MV0_CLASSES = 10_000_000, 100_000


def embeddings(classes: int, per_class: int, noise: float = 0.5, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    true = np.repeat(np.arange(classes), per_class)
    centres = rng.normal(0, 1, (classes, DIM)).astype(np.float32)
    emb = centres[true] + rng.normal(0, 0.8, (len(true), DIM)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    given = true.copy()
    flip = rng.random(len(true)) < noise
    given[flip] = rng.integers(0, classes, int(flip.sum()))
    return emb, given


def part(name: str, classes: int, per_class: int) -> dict:
    import numpy as np
    import torch

    from noisydml.config import load_params
    from noisydml.methods.parts.dcq import margin_softmax_loss
    from noisydml.methods.parts.prism import ClassCentreMemory, SlidingThreshold, clean_probability
    from noisydml.methods.parts.sgm import run_sgm
    from noisydml.tools.check import check_all

    torch.set_num_threads(1)
    emb, labels = embeddings(classes, per_class)
    start = time.perf_counter()
    if name == "sgm":
        sgm = check_all(load_params("params.yaml"))["methods"]["dcq_sgps"]["sgm"]
        stats = run_sgm(emb, labels, sgm, np.random.default_rng(0)).stats
        extra = {"subgroups": stats["subgroups"]}
    else:  # one PCS + Eq. 18 step against a full queue (the memory's centres are classes x d float64)
        memory = ClassCentreMemory(QUEUE, DIM, classes)
        rng = np.random.default_rng(1)
        for at in range(0, QUEUE, BATCH):
            rows = rng.integers(0, len(labels), BATCH)
            memory.enqueue(torch.from_numpy(emb[rows]), torch.from_numpy(labels[rows]))
        start = time.perf_counter()
        rows = rng.integers(0, len(labels), BATCH)
        q = torch.from_numpy(emb[rows]).requires_grad_(True)
        y = torch.from_numpy(labels[rows])
        keep, _ = SlidingThreshold(0.5, 30).select(clean_probability(memory, q, y), memory.class_counts[y] > 0)
        margin_softmax_loss(q[keep], q[keep].detach(), y[keep], memory.features, memory.labels, 50.0, 0.3).backward()
        extra = {"centre_sums_mib": memory.class_sums.numel() * 8 / 2**20}
    return {"part": name, "classes": classes, "rows": len(labels), "seconds": time.perf_counter() - start,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}


def sgm_by_part(classes: int, per_class: int) -> dict:
    """SGM's parts on ``classes x per_class`` rows, as :func:`run_sgm` runs them, each with its seconds and the peak
    resident memory sampled while it ran."""
    import threading

    import numpy as np

    from noisydml.config import load_params
    from noisydml.methods.parts import sgm as S
    from noisydml.tools.check import check_all

    cfg = check_all(load_params("params.yaml"))["methods"]["dcq_sgps"]["sgm"]
    emb, labels = embeddings(classes, per_class)

    def rss() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))

    peak = [rss()]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], rss())

    threading.Thread(target=watch, daemon=True).start()
    out = {"classes": classes, "rows": len(labels), "start_mib": rss()}

    def timed(name, fn):
        peak[0] = rss()
        t0 = time.perf_counter()
        value = fn()
        out[f"{name}_s"] = time.perf_counter() - t0
        out[f"{name}_peak_mib"] = max(peak[0], rss())
        return value

    intra = timed("alg1", lambda: S.intra_class_subgroups(emb, labels, cfg["lambda_max"], cfg["lambda_min"]))
    tau_k, tau_max, cell = S.sgm_sizes(cfg, len(labels), len(np.unique(labels)))
    _, merges = timed("alg2", lambda: S.bottom_up(emb, intra, tau_k, tau_max, cfg["merge_min_similarity"],
                                                  cfg["meta_merge_similarity"], cfg["neighbours"]))
    timed("alg34", lambda: S.top_down(emb, intra, cell, np.random.default_rng(0)))
    stop.set()
    out["alg2_knn_s"] = merges.pop("seconds_knn", 0.0)
    return {**out, "subgroups": intra.count, **merges}


def series(per_class: list[int], classes: int = MS1MV0_CLASSES) -> None:
    import numpy as np

    rows = []
    for k in per_class:
        out = subprocess.run([sys.executable, __file__, "--part", "series", "--classes", str(classes),
                              "--images-per-class", str(k)], capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]))
    print("\n| rows | subgroups | Alg. 1 s / MiB above start | Alg. 2 s (its k-NN search) / MiB | "
          "Algs. 3-4 s / MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[f'{p}_s']:.1f}" + (f" ({r['alg2_knn_s']:.1f})" if p == "alg2" else "")
                 + f" / {r[f'{p}_peak_mib'] - r['start_mib']:,.0f}" for p in ("alg1", "alg2", "alg34")]
        print(f"| {r['rows']:,} | {r['subgroups']:,} | " + " | ".join(cells) + " |")
    if len(rows) > 1:
        x = np.log([r["rows"] for r in rows])
        figures = {"alg1 s": [r["alg1_s"] for r in rows], "alg2 k-NN s": [r["alg2_knn_s"] for r in rows],
                   "alg2 rest s": [r["alg2_s"] - r["alg2_knn_s"] for r in rows],
                   "alg34 s": [r["alg34_s"] for r in rows]}
        figures.update({f"{p} MiB above start": [r[f"{p}_peak_mib"] - r["start_mib"] for r in rows]
                        for p in ("alg1", "alg2", "alg34")})
        for what, values in figures.items():
            slope, intercept = np.polyfit(x, np.log(np.maximum(values, 1e-3)), 1)
            print(f"  {what} ~ rows^{slope:.2f}: {np.exp(intercept) * MS1MV0_IMAGES ** slope:,.0f} at "
                  f"{MS1MV0_IMAGES:,} rows (extrapolated from {len(rows)} sizes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--images-per-class", type=int, default=20)
    parser.add_argument("--series", type=int, nargs="+", metavar="IMAGES_PER_IDENTITY",
                        help="SGM by part at 100K identities x each of these images per identity")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "series":
        print(json.dumps(sgm_by_part(args.classes[0], args.images_per_class)))
        return
    if args.part:
        print(json.dumps(part(args.part, args.classes[0], args.images_per_class)))
        return
    if args.series:
        series(args.series)
        return
    import numpy as np

    results = []
    for name in ("sgm", "step"):
        for classes in args.classes:
            out = subprocess.run([sys.executable, __file__, "--part", name, "--classes", str(classes),
                                  "--images-per-class", str(args.images_per_class)],
                                 capture_output=True, text=True, check=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(results[-1]))
    print(f"\nat MS1MV0 ({MS1MV0_IMAGES:,} images, {MS1MV0_CLASSES:,} identities), by a power law in the class count "
          f"fitted to {args.classes} x {args.images_per_class} images:")
    for name in ("sgm", "step"):
        rows = [r for r in results if r["part"] == name]
        x = np.log([r["classes"] for r in rows])
        for what, unit in (("seconds", "s"), ("peak_mib", "MiB peak")):
            slope, intercept = np.polyfit(x, np.log([r[what] for r in rows]), 1)
            print(f"  {name}: {what} ~ classes^{slope:.2f}: {np.exp(intercept) * MS1MV0_CLASSES ** slope:,.2f} {unit} "
                  f"at {MS1MV0_CLASSES:,} identities x {args.images_per_class} images (MS1MV0 has "
                  f"~{MS1MV0_IMAGES // MS1MV0_CLASSES} per identity: x{MS1MV0_IMAGES // MS1MV0_CLASSES // args.images_per_class} "
                  "the rows)")
    print(f"  feature bank: {MS1MV0_IMAGES * DIM * 4 / 2**30:.1f} GiB float32 (N x {DIM}); PCS's class-centre sums: "
          f"{MS1MV0_CLASSES * DIM * 8 / 2**30:.2f} GiB float64; the queue: {QUEUE * DIM * 4 / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
