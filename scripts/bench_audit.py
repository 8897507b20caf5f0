"""Time and peak memory of the label audit's detectors at a benchmark's scale, on synthetic embeddings.

    python scripts/bench_audit.py                      # SOP's training split: 59,551 rows, 11,318 classes, 512-d
    python scripts/bench_audit.py --rows 6400 --classes 200 --dim 64 --detectors all

Rows of a class lie around its centre; ``--noise`` of them carry another class's label. Each detector runs in a
fresh process (its peak RSS is its own: ``resource.getrusage``'s maximum resident set) and prints seconds, peak
MiB, its AUROC and flag F1 against the flips (and, for the confident-learning ones, cleanlab's noise-rate
estimate). Left out of the default list (``--detectors all`` runs them): ``confident_learning``, whose dense probe
refuses SOP's scale (N x classes probabilities of 2.5 GiB, a multinomial fit over every class per fold), and
``datalab``, which the kernel killed at 24 GB at SOP's scale.
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


def embeddings(rows: int, classes: int, dim: int, noise: float, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    true = np.sort(rng.integers(0, classes, rows))
    true[:classes] = np.arange(classes)  # every class present
    true = np.sort(true)
    centres = rng.normal(0, 1, (classes, dim)).astype(np.float32)
    emb = centres[true] + rng.normal(0, 0.6, (rows, dim)).astype(np.float32)
    given = true.copy()
    flip = rng.random(rows) < noise
    given[flip] = (true[flip] + rng.integers(1, classes, flip.sum())) % classes
    return emb, given, true


def one(args) -> dict:
    import numpy as np

    from noisydml.audit import detectors
    from noisydml.audit.judge import judge

    emb, given, true = embeddings(args.rows, args.classes, args.dim, args.noise)
    ids = np.arange(len(given))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if args.one == "confident_learning":
        frame = detectors.confident_learning(detectors.cross_fitted_probabilities(emb, given, 5, 0), given, ids)
    else:
        frame = getattr(detectors, args.one)(emb, given, ids)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    judged = judge(frame, given != true)
    return {"detector": args.one, "seconds": round(seconds, 1), "peak_mib": round(peak), "data_mib": round(base),
            "auroc": round(judged["auroc"], 3), "flag_f1": round(judged.get("flag_f1", float("nan")), 3),
            "estimated_noise_rate": round(frame.attrs.get("estimated_noise_rate", float("nan")), 3)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=59551)
    parser.add_argument("--classes", type=int, default=11318)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--detectors", default="knn_disagreement,knn_confident_learning,centroid_confident_learning",
                        help="comma-separated, or all (adds confident_learning)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process's detector
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args)))
        return
    names = ("knn_disagreement", "knn_confident_learning", "centroid_confident_learning", "datalab",
             "confident_learning") \
        if args.detectors == "all" else \
        args.detectors.split(",")
    print(f"{args.rows} rows, {args.classes} classes, {args.dim}-d, {args.noise:.0%} flipped")
    for name in names:
        out = subprocess.run([sys.executable, __file__, *argv, "--one", name], capture_output=True, text=True)
        if out.returncode:
            print(f"{name}: failed\n{out.stderr[-2000:]}")
            continue
        print(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main(sys.argv[1:])
