"""SGPS Table IV on the synthetic benchmark `faces_large`, 3 seeds: runs it through the real launcher in a scratch
clone of this checkout's HEAD and writes what the report's Table IV section reads.

    python scripts/face_table4.py /tmp/face_table4              # clone, two launches, collect (~1 h on 2 cores)
    python scripts/face_table4.py /tmp/face_table4 --collect    # collect an earlier run's metrics only
    python scripts/face_table4.py /tmp/face_table4 --dry        # validate both launches' overrides
    python scripts/face_table4.py /tmp/face_table4 --resume     # after a failure: the launches again, in that clone

Two launches, because one grid trains every method on every dataset: the noisy set with every Table IV row we
implement (ArcFace, CosFace, Sub-center, SKH, DCQ, DCQ + SKH, DCQ + SGPS), then the cleaned twin with the rows the
paper trains on MS1MV2 (ArcFace, DCQ). The settings are the face grid's (docs/datasets.md), plus, ours and labelled
in the output: DCQ's queue (each of DCQ + SKH's K queues, and DCQ + SGPS's memory, the same queue) scaled to 128
keys, so a queue holds under 13 % of the 1,000 identities, as DCQ's 8,192 hold 8 % of MS1MV0's ~100K.

Writes ``references/face_table4_synthetic.csv`` (one row per dataset, method and seed: every verification and
retrieval metric, in %) and ``references/face_table4_synthetic.json`` (the commit, the CPU, each launch's wall time,
the overrides). The report's SGPS section renders them (``noisydml.studies.sgps``); the pipeline never re-runs
them: re-run this script after a change to a face method or to the protocols.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "references" / "face_table4_synthetic"
SEEDS = [0, 1, 2]
NOISY = ("faces_large", ["arcface", "cosface", "subcenter_arcface", "skh", "dcq", "dcq_skh", "dcq_sgps"])
CLEANED = ("faces_large_clean", ["arcface", "dcq"])
#: ours: DCQ's queue at the benchmark's scale (128 of 1,000 identities; DCQ's code: 8,192 of ~100K)
QUEUE = 128


def overrides(dataset: str, methods: list[str]) -> list[str]:
    """The face grid's overrides (docs/datasets.md) for ``dataset`` and ``methods`` at 3 seeds, DCQ's queue scaled."""
    return ["-S", f"grid.datasets=[{dataset}]", "-S", "grid.noises=[clean]", "-S", f"grid.methods=[{','.join(methods)}]",
            "-S", f"grid.seeds=[{','.join(map(str, SEEDS))}]", "-S", "pretrain.source=faces",
            "-S", f"timing.dataset={dataset}", "-S", "timing.noise=clean", "-S", "~chains", "-S", "+chains={}",
            "-S", "~figures.bspml_maps", "-S", "+figures.bspml_maps={}",
            "-S", f"methods.dcq.queue_size={QUEUE}", "-S", f"methods.dcq_skh.queue_size={QUEUE}",
            "-S", f"methods.dcq_sgps.memory_size={QUEUE}"]


def cpu_name() -> str:
    """The CPU's name with its family and model (hosts of one name differ ~3x in speed)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        return f"{fields['model name']} (family {fields['cpu family']}, model {fields['model']})"
    except (OSError, KeyError):
        return platform.processor() or "unknown"


def launch(work: Path, dataset: str, methods: list[str], dry: bool) -> float:
    command = ["noisydml", "launch", "-j", "2", "--quiet-epochs", *(["--dry"] if dry else []),
               *overrides(dataset, methods)]
    print("$", " ".join(command), flush=True)
    start = time.time()
    subprocess.run(["git", "checkout", "-q", "params.yaml"], cwd=work, check=True)
    subprocess.run(command, cwd=work, check=True)
    return time.time() - start


def collect(work: Path) -> pd.DataFrame:
    rows = []
    for dataset, methods in (NOISY, CLEANED):
        for method in methods:
            for seed in SEEDS:
                path = work / "metrics" / dataset / "clean" / method / f"seed{seed}.json"
                if not path.is_file():
                    raise SystemExit(f"{path}: missing; run the launches first")
                saved = json.loads(path.read_text())
                metrics = {k: v for k, v in saved["metrics"].items() if isinstance(v, (int, float))}
                for key in ("precision_at_1", "mean_average_precision_at_r"):  # retrieval in %, as verification
                    metrics[key] = 100 * metrics[key]
                rows.append({"dataset": dataset, "method": method, "seed": seed, **metrics})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path, help="a scratch folder for the clone (removed and re-made)")
    parser.add_argument("--collect", action="store_true", help="only collect an earlier run's metrics")
    parser.add_argument("--dry", action="store_true", help="validate both launches' overrides, train nothing")
    parser.add_argument("--resume", action="store_true",
                        help="launch again in the existing clone (after `git pull` there): what finished is kept")
    args = parser.parse_args()
    work = args.workdir
    seconds = {}
    if not args.collect:
        if not args.resume:
            subprocess.run(["rm", "-rf", str(work)], check=True)
            subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
            subprocess.run(["dvc", "cache", "dir", str(REPO / ".dvc" / "cache")], cwd=work, check=True)
        for dataset, methods in (NOISY, CLEANED):
            seconds[dataset] = round(launch(work, dataset, methods, args.dry), 1)
        if args.dry:
            return 0
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, capture_output=True, text=True,
                            check=True).stdout.strip()  # the clone's: the code that trained and evaluated
    table = collect(work)
    table.to_csv(OUT.with_suffix(".csv"), index=False, float_format="%.4f")
    info = {"commit": commit, "cpu": cpu_name(), "cores": len(__import__("os").sched_getaffinity(0)),
            "launch_seconds": seconds, "queue_size": QUEUE, "seeds": SEEDS,
            "launches": {d: " ".join(overrides(d, m)) for d, m in (NOISY, CLEANED)}}
    if args.collect and OUT.with_suffix(".json").is_file():  # keep the timing of the run collected
        info["launch_seconds"] = json.loads(OUT.with_suffix(".json").read_text()).get("launch_seconds", {})
    OUT.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"{len(table)} runs -> {OUT.with_suffix('.csv')} ({commit[:7]}, {info['cpu']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
