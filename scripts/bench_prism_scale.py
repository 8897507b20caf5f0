"""PRISM's selection at benchmark scale: scorable share, fallback rate, selection precision and recall.

    python scripts/bench_prism_scale.py [--batches 300]
    python scripts/bench_prism_scale.py --profiles     # every profile's setting: references/prism_selection_scale.json

Simulates P x K batches (16 labels x 4 samples, sampled by noisy label as the trainer does) of
class-structured embeddings with 50% symmetric noise, at SOP's size (11,318 training classes) and
In-Shop's (3,997), with PRISM's memory of 8,192 and R = 0.5, window 30, and compares our threshold
(ranked over scorable samples, i.e. classes present in the memory) with the authors' rule as their code runs
it (:class:`AuthorsThreshold`: every sample ranked, P_clean = 1 when the class has no feature in the memory, a
quantile of 1.0 never enters the window). Cars-sized (98 classes) is the control.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from noisydml.methods.parts.prism import ClassCentreMemory, SlidingThreshold, clean_probability
from noisydml.tools.profiles import KEPT_SHARES  # where --profiles writes, the profiles table reads


class AuthorsThreshold:
    """The authors' rule as their PRISM.py runs it (alibaba-edu/Ranking-based-Instance-Selection @06e7fa2),
    written out: every sample ranked, ``P_clean = 1`` for a class with no centre; ``Q_t`` = the
    ``int(R * B)``-th lowest score, pushed into the window only when it is neither NaN nor 1.0; an empty window
    drops the ``int(R * B)`` lowest; otherwise samples above the window mean are kept and, when none is, the
    lowest are dropped and the window restarts from its last value."""

    def __init__(self, noise_rate: float, window: int):
        self.noise_rate, self.window, self.values = noise_rate, window, []
        self.fell_back = self.empty_window = False

    def select(self, p_clean, scorable=None):
        scores = p_clean.double()
        to_remove = torch.argsort(scores)[: int(self.noise_rate * len(scores))]
        q = float(scores[to_remove[-1]])
        if not np.isnan(q) and q != 1.0:
            self.values = (self.values + [q])[-self.window:]
        self.fell_back, self.empty_window = False, not self.values
        if self.values:
            keep = scores > sum(self.values) / len(self.values)
            if keep.any():
                return keep, sum(self.values) / len(self.values)
            self.fell_back, self.values = True, self.values[-1:]
        keep = torch.ones(len(scores), dtype=torch.bool)
        keep[to_remove] = False
        return keep, q


def simulate(num_classes: int, memory_size: int = 8192, batches: int = 300, noise: float = 0.5, dim: int = 64,
             rule: str = "ours", seed: int = 0, noise_rate: float | None = None, classes_per_batch: int = 16,
             per_class: int = 4) -> dict[str, float]:
    """One simulation: ``batches`` P x K batches (``classes_per_batch`` x ``per_class``) with ``noise`` symmetric
    noise through PRISM's memory of ``memory_size`` and the ``rule``'s threshold at R = ``noise_rate`` (default:
    ``noise``)."""
    noise_rate = noise if noise_rate is None else noise_rate
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    centres = F.normalize(torch.randn(num_classes, dim, generator=gen), dim=1)
    memory = ClassCentreMemory(memory_size, dim, num_classes)
    threshold = (SlidingThreshold if rule == "ours" else AuthorsThreshold)(noise_rate, 30)
    counts = dict(scorable=0, seen=0, fallback=0, empty=0, kept=0, kept_scorable=0, kept_scorable_clean=0,
                  scorable_clean=0)
    for _ in range(batches):
        labels = np.repeat(rng.choice(num_classes, classes_per_batch, replace=False), per_class)
        noisy = rng.random(len(labels)) < noise
        true = np.where(noisy, (labels + rng.integers(1, num_classes, len(labels))) % num_classes, labels)
        emb = F.normalize(centres[true] * 2.0 + 0.5 * torch.randn(len(labels), dim, generator=gen), dim=1)
        labels_t = torch.as_tensor(labels)
        scorable = memory.class_counts[labels_t] > 0
        keep, _ = threshold.select(clean_probability(memory, emb, labels_t), scorable)
        memory.enqueue(emb[keep], labels_t[keep])
        s, k, clean = scorable.numpy(), keep.numpy(), ~noisy
        counts["seen"] += len(labels)
        counts["scorable"] += int(s.sum())
        counts["fallback"] += int(threshold.fell_back)
        counts["empty"] += int(getattr(threshold, "empty_window", False))
        counts["kept"] += int(k.sum())
        counts["kept_scorable"] += int((k & s).sum())
        counts["kept_scorable_clean"] += int((k & s & clean).sum())
        counts["scorable_clean"] += int((s & clean).sum())
    kept = counts["kept_scorable"]
    return {
        "scorable_share": counts["scorable"] / counts["seen"],
        "fallback_rate": counts["fallback"] / batches,
        "empty_window_rate": counts["empty"] / batches,
        "kept_share": counts["kept"] / counts["seen"],
        "kept_share_of_scorable": kept / max(counts["scorable"], 1),
        "clean_share_of_scorable": counts["scorable_clean"] / max(counts["scorable"], 1),
        "precision": counts["kept_scorable_clean"] / kept if kept else float("nan"),
        "recall": counts["kept_scorable_clean"] / max(counts["scorable_clean"], 1),
    }


def profiles_kept_shares(batches: int) -> dict:
    """Both rules at every selection setting of every profile (50 % symmetric noise simulated)."""
    from noisydml.tools.plan import selection_settings
    from noisydml.tools.profiles import load_profiles, params_after

    settings = {}
    for name, profile in load_profiles().items():
        for s in selection_settings(params_after(profile["set"])):
            settings.setdefault(json.dumps(s, sort_keys=True), []).append(name)
    rows = []
    for key, names in settings.items():
        s = json.loads(key)
        row = {**s, "profiles": sorted(set(names))}
        for rule in ("ours", "authors"):
            t0 = time.perf_counter()
            r = simulate(s["classes"], s["memory_size"], batches=batches, rule=rule, noise_rate=s["noise_rate"],
                         classes_per_batch=s["classes_per_batch"], per_class=s["per_class"])
            row[rule] = {k: round(v, 4) for k, v in r.items()}
            print(f"{s} {rule}: kept of scorable {r['kept_share_of_scorable']:.3f}, scorable {r['scorable_share']:.3f} "
                  f"({time.perf_counter() - t0:.1f} s)")
        rows.append(row)
    return {"batches": batches, "noise": 0.5, "settings": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--profiles", action="store_true",
                        help=f"every profile's selection settings, both rules, written to {KEPT_SHARES}")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.profiles:
        out = profiles_kept_shares(args.batches)
        Path(KEPT_SHARES).parent.mkdir(parents=True, exist_ok=True)
        Path(KEPT_SHARES).write_text(json.dumps(out, indent=1) + "\n")
        print(f"{KEPT_SHARES}: written")
        return
    print(f"{'size':<8} {'classes':>7} {'rule':<8} {'scorable':>8} {'fallback':>8} {'empty w':>7} {'kept':>6} "
          f"{'kept/s':>6} {'clean':>6} {'precision':>9} {'recall':>6}  (kept/s, clean, precision, recall: over scorable "
          f"samples; {args.batches} batches of 16 x 4, R 0.5, M 8,192)")
    for name, classes in (("SOP", 11318), ("In-Shop", 3997), ("Cars", 98)):
        for rule in ("ours", "authors"):
            t0 = time.perf_counter()
            r = simulate(classes, batches=args.batches, rule=rule)
            print(f"{name:<8} {classes:>7} {rule:<8} {r['scorable_share']:>8.3f} {r['fallback_rate']:>8.3f} "
                  f"{r['empty_window_rate']:>7.3f} {r['kept_share']:>6.3f} {r['kept_share_of_scorable']:>6.3f} {r['clean_share_of_scorable']:>6.3f} {r['precision']:>9.3f} "
                  f"{r['recall']:>6.3f}  ({time.perf_counter() - t0:.1f}s)")


if __name__ == "__main__":
    main()
