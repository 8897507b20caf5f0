"""Benchmark of the lazy image pipeline (issue 13): prints figures, asserts nothing.

1. Throughput: images/s decoded + augmented (RandomResizedCrop(224) + flip + normalisation) by
   :class:`noisydml.data.images.InputPipeline` for 1, 2 and 4 DataLoader workers, on JPEG "photos" of CUB's
   typical size (500 x 375).
2. Memory: the peak resident memory of a training run (one epoch + the final embedding passes, small_cnn, crop 32)
   on file-stored fixtures of increasing size, each in its own process. With files decoded per batch it must not
   grow with the number of images (only the per-sample label/embedding arrays do: 64 floats per image).

    python scripts/bench_data_pipeline.py                  # 1,000 photos; fixtures of 6,000 and 60,000 images
    python scripts/bench_data_pipeline.py --photos 200 --sizes 2000 20000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_photos(root: Path, n: int, size: tuple[int, int], classes: int, quality: int = 90) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        c = i % classes
        base = rng.uniform(0, 255, 3)
        img = base + xx[..., None] * rng.uniform(-0.4, 0.4, 3) + yy[..., None] * rng.uniform(-0.4, 0.4, 3)
        img += rng.normal(0, 10, (h, w, 3))
        path = root / f"{c:05d}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=quality)
        paths.append(str(path))
    return paths


def throughput(photos: int, workers: list[int]) -> None:
    import torch

    from noisydml.data.images import ImageFiles, InputPipeline, InputTransform

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        paths = make_photos(Path(tmp), photos, (500, 375), classes=50)
        print(f"made {photos} JPEG photos of 500x375 in {time.perf_counter() - t0:.1f}s")
        files = ImageFiles(paths, np.arange(len(paths)))
        batches = [np.arange(i, min(i + 64, len(paths))) for i in range(0, len(paths), 64)]
        print(f"{'workers':>8} {'images/s':>9}  (decode + RandomResizedCrop(224, 0.2-1) + flip + normalise, "
              f"batches of 64, {os.cpu_count()} CPU cores)")
        for w in workers:
            pipe = InputPipeline(InputTransform(), seed=0, workers=w)
            list(pipe.train_batches(files, batches[:2], epoch=99))  # warm the page cache and the workers' start
            t0 = time.perf_counter()
            n = sum(len(x) for x in pipe.train_batches(files, batches, epoch=0))
            print(f"{w:>8} {n / (time.perf_counter() - t0):>9.1f}")


def child_train(root: str, n: int) -> None:
    """One training run on the fixture at ``root`` (``n`` images); print its peak RSS as JSON."""
    import torch

    from noisydml.config import load_params
    from noisydml.data.images import ImageFiles
    from noisydml.engine.job import Job
    from noisydml.engine.types import ImageSet, RunSpec
    from noisydml.pipeline.job import fit
    from noisydml.tools.check import check_all

    torch.set_num_threads(2)
    params = check_all(load_params(str(Path(__file__).resolve().parents[1] / "params.yaml")))
    paths = sorted(str(p) for p in Path(root).rglob("*.jpg"))[:n]
    labels = np.array([int(Path(p).parent.name) for p in paths])
    files = ImageFiles(paths, np.arange(len(paths)))
    train, test = labels % 2 == 0, labels % 2 == 1
    dense_train = np.unique(labels[train], return_inverse=True)[1]
    dense_test = np.unique(labels[test], return_inverse=True)[1]
    cfg = {**params["train"], "epochs": 1, "batch": {"classes": min(16, int(train.sum()) // 30), "per_class": 4}, "pretrained": "none", "backbone_width": 8, "eval_every": 0,
           "input": {**params["train"]["input"], "crop": 32, "resize": 36}}
    spec = RunSpec("ms", params["methods"]["ms"], cfg, seed=0, data_fingerprint=f"bench-{n}")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        fit(Job(spec, ImageSet(files[np.flatnonzero(train)], dense_train),
                ImageSet(files[np.flatnonzero(test)], dense_test), Path(tmp) / "ckpt.pt",
                runtime={**params["runtime"], "progress": False, "threads": 2}))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"images": len(paths), "peak_rss_mib": peak / 1024, "rss_before_training_mib": base / 1024,
                      "seconds": time.perf_counter() - t0}))


def memory(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        make_photos(Path(tmp), max(sizes), (48, 40), classes=max(sizes) // 30, quality=85)
        print(f"\nmade {max(sizes)} small JPEGs (48x40, 30 per class) in {time.perf_counter() - t0:.1f}s")
        print(f"{'images':>8} {'peak RSS MiB':>13} {'before training':>16} {'seconds':>8}  (1 epoch + final embedding "
              "passes; one process each)")
        for n in sorted(sizes):
            out = subprocess.run([sys.executable, __file__, "--child", tmp, str(n)], capture_output=True, text=True,
                                 check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{r['images']:>8} {r['peak_rss_mib']:>13.0f} {r['rss_before_training_mib']:>16.0f} "
                  f"{r['seconds']:>8.0f}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_train(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[6000, 60000])
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    throughput(args.photos, args.workers)
    if not args.skip_memory:
        memory(args.sizes)


if __name__ == "__main__":
    main()
