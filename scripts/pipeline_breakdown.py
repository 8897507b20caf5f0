"""Where a finished `dvc repro`'s wall time went: training epochs, process start-up, the rest.

The epochs include what runs beside them in the same process: MLflow opens each run in a background thread
during the first epoch (on 2 cores it competes with training), so the first epochs' excess over the later
ones is printed too.

    python scripts/pipeline_breakdown.py

Reads the records the stages leave outside DVC's outputs: ``.runinfo/stages/*.json`` (each stage process's
start, the moment its work began after imports and params, its end) and ``.runinfo/<run>.json`` (each
training run's seconds per epoch). The wall time of the repro is taken from the first stage process's
start to the last one's end, so DVC's own time between stages counts too; the last repro is the run of
stage records, back from the newest, with no gap of a minute or more.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def main(root: Path = Path(".")) -> None:
    stages = [json.loads(p.read_text()) for p in sorted((root / ".runinfo" / "stages").glob("*.json"))]
    if not stages:
        print("no stage records in .runinfo/stages: run `dvc repro` first")
        return
    # the last repro: walking back from the latest stage, the records that follow each other with gaps of
    # under a minute (DVC runs stages one after the other)
    stages.sort(key=lambda r: r["process_start"])
    window = [stages[-1]]
    start = stages[-1]["process_start"]
    for r in reversed(stages[:-1]):
        if r["end"] < start - 60:
            break
        window.append(r)
        start = min(start, r["process_start"])
    last_end = max(r["end"] for r in window)
    wall = last_end - start
    by_kind = defaultdict(lambda: [0, 0.0, 0.0])
    for r in window:
        kind = r["stage"].split("@")[0]
        by_kind[kind][0] += 1
        by_kind[kind][1] += r["wall_seconds"]
        by_kind[kind][2] += r["startup_seconds"]
    epochs = 0.0
    first_excess = 0.0  # each run's first epoch beyond its later epochs' mean
    runs = 0
    for p in (root / ".runinfo").rglob("seed*.json"):
        info = json.loads(p.read_text())
        if p.stat().st_mtime >= start - 1:
            seconds = info.get("epoch_seconds", [])
            epochs += sum(seconds)
            if len(seconds) > 1:
                first_excess += max(0.0, seconds[0] - sum(seconds[1:]) / len(seconds[1:]))
            runs += 1
    stage_seconds = sum(v[1] for v in by_kind.values())
    print(f"dvc repro wall time: {wall:.1f} s ({len(window)} stage processes, {runs} training runs)")
    print(f"{'stage':<10} {'processes':>9} {'wall s':>8} {'start-up s':>10}")
    for kind, (n, seconds, startup) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{kind:<10} {n:>9} {seconds:>8.1f} {startup:>10.1f}")
    print(f"training epochs:          {epochs:8.1f} s  {100 * epochs / wall:5.1f}% of the wall time")
    print(f"  of which first epochs' excess over later ones: {first_excess:.1f} s (MLflow opening its run in a "
          "background thread, torch warm-up)")
    startup = sum(v[2] for v in by_kind.values())
    print(f"process start-up/imports: {startup:8.1f} s  {100 * startup / wall:5.1f}%")
    print(f"other work in stages:     {stage_seconds - startup - epochs:8.1f} s  "
          f"{100 * (stage_seconds - startup - epochs) / wall:5.1f}%")
    print(f"DVC between stages:       {wall - stage_seconds:8.1f} s  {100 * (wall - stage_seconds) / wall:5.1f}%")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", nargs="?", default=".", type=Path, help="the repository (default: .)")
    main(parser.parse_args().root)
