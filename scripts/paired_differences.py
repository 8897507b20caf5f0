"""Paired per-seed differences of test P@1 between two runs, with the report's intervals and verdict; prints a table.

    python scripts/paired_differences.py --seeds 0 1 2 \\
        metrics:glyphs/sym50/sgps=metrics:glyphs/sym50/prism \\
        /tmp/new/metrics:glyphs/sym50/bspml=/tmp/old/metrics:glyphs/sym50/bspml

Each argument is ``A=B``, each side ``<metrics folder>:<dataset>/<noise>/<run>``: the evaluate stage's
``<metrics folder>/<dataset>/<noise>/<run>/seed<n>.json`` (so runs of two checkouts, e.g. a default's old and new
value, pair up at the same seeds). Prints A's and B's P@1 per seed, A - B per seed, the mean, the 95% interval
over seeds (paired t) and over test classes (bootstrap of whole classes, the same draw for both runs and every
seed), and the verdict of :mod:`noisydml.reporting.uncertainty`: above / below only where both intervals exclude
0, undecided otherwise. ``--markdown`` prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from noisydml.reporting.uncertainty import class_interval, interval_text, seed_interval, verdict


def _side(text: str) -> tuple[Path, str]:
    folder, _, run = text.rpartition(":")
    if not folder or run.count("/") != 2:
        raise SystemExit(f"{text!r}: allowed: <metrics folder>:<dataset>/<noise>/<run>")
    return Path(folder), run


def _load(side: tuple[Path, str], seed: int) -> dict:
    path = side[0] / side[1] / f"seed{seed}.json"
    if not path.is_file():
        raise SystemExit(f"{path}: missing (train and evaluate that run at seed {seed} first)")
    return json.loads(path.read_text())


def compare(a: tuple[Path, str], b: tuple[Path, str], seeds: list[int]) -> dict:
    """Per-seed P@1 (%) of both runs and the difference's intervals and verdict."""
    ma, mb = [_load(a, s) for s in seeds], [_load(b, s) for s in seeds]
    pa = [100 * m["metrics"]["precision_at_1"] for m in ma]
    pb = [100 * m["metrics"]["precision_at_1"] for m in mb]
    diffs = [x - y for x, y in zip(pa, pb)]
    seed_ci = seed_interval(diffs)
    class_ci = class_interval([m["per_class_precision_at_1"] for m in ma], [m["per_class_precision_at_1"] for m in mb])
    return {"a": pa, "b": pb, "diffs": diffs, "mean": float(np.mean(diffs)), "seed_ci": seed_ci,
            "class_ci": class_ci, "verdict": verdict(seed_ci, class_ci)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="A=B, each <metrics folder>:<dataset>/<noise>/<run>")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.markdown:
        print("| A | B | A per seed | B per seed | A - B per seed | mean | 95% over seeds | 95% over classes | verdict |")
        print("|---|---|---|---|---|---|---|---|---|")
    for pair in args.pairs:
        left, sep, right = pair.partition("=")
        if not sep:
            raise SystemExit(f"{pair!r}: allowed: A=B")
        a, b = _side(left), _side(right)
        r = compare(a, b, args.seeds)
        cells = [f"{a[0]}:{a[1]}", f"{b[0]}:{b[1]}", " / ".join(f"{x:.2f}" for x in r["a"]),
                 " / ".join(f"{x:.2f}" for x in r["b"]), ", ".join(f"{x:+.2f}" for x in r["diffs"]),
                 f"{r['mean']:+.2f}", interval_text(r["seed_ci"], 2), interval_text(r["class_ci"], 2), r["verdict"]]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))


if __name__ == "__main__":
    main()
