"""Benchmark: many runs at once (noisydml.tools.launch) against one at a time.

    python scripts/bench_launch.py side-by-side [--steps 300]
        training steps/s of the default backbone: one process alone, then two processes at once, with OpenMP's
        default waiting (threads spin) and with OMP_WAIT_POLICY=PASSIVE (threads sleep); runtime.threads each
    python scripts/bench_launch.py fixed-cost [REPO]
        each training run's cost outside its epochs and embedding passes, from the records of REPO's last run
        (.runinfo): process (or, in a warm worker, stage) start to first step, and last step to the stage's end
    python scripts/bench_launch.py grid [--jobs 2] [--serial] [--fresh-processes]
        the default grid from a clean clone of HEAD (minutes: tens of them): `dvc repro` (with --serial) and the
        launcher, each in its own clone; wall times, fixed costs, and whether every output equals the
        committed dvc.lock's

Prints figures; asserts nothing (README "Many runs at once" quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from noisydml.tools.guard import stage_digests

REPO = Path(__file__).resolve().parents[1]

STEPS_CODE = """
import sys, time
from noisydml import numerics
from noisydml.config import load_params
params = load_params({params!r})
numerics.pin(params["runtime"])
import torch
from noisydml.models import build_model
torch.manual_seed(0)
train = params["train"]
model = build_model(train, in_channels=1)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
b = train["batch"]["classes"] * train["batch"]["per_class"]
side = params["datasets"]["glyphs"]["image_size"]
images = torch.rand(b, 1, side, side)
def step():
    loss = model(images).sum()
    opt.zero_grad(); loss.backward(); opt.step()
for _ in range(5):
    step()
t0 = time.perf_counter()
for _ in range({steps}):
    step()
print({steps} / (time.perf_counter() - t0))
"""


def side_by_side(steps: int) -> None:
    code = STEPS_CODE.format(params=str(REPO / "params.yaml"), steps=steps)

    def run(n: int, wait_policy: str | None) -> list[float]:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env["PYTHONPATH"] = str(REPO / "src")
        if wait_policy:
            env["OMP_WAIT_POLICY"] = wait_policy
        procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(n)]
        return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]

    print(f"training steps/s of the default backbone (params.yaml; {steps} steps, runtime.threads each)")
    print(f"{'':42} {'alone':>8} {'2 at once (each)':>17} {'2 at once (sum)':>16}")
    for label, policy in (("OpenMP default (waiting threads spin)", None), ("OMP_WAIT_POLICY=PASSIVE", "PASSIVE")):
        alone = run(1, policy)[0]
        pair = run(2, policy)
        print(f"{label:<42} {alone:>8.1f} {' / '.join(f'{x:.1f}' for x in pair):>17} {sum(pair):>16.1f}")


def fixed_costs(root: Path) -> list[dict]:
    """Per training run of REPO's records: seconds before its first step, after its last step (less the embedding
    passes after it), epochs."""
    rows = []
    for record_path in (root / ".runinfo" / "stages").rglob("*.json"):
        record = json.loads(record_path.read_text())
        if not record["stage"].startswith("train@runs/"):
            continue
        folder = record["stage"].split("@", 1)[1]
        parts = Path(folder).parts
        if len(parts) != 5:  # a chained stage (several seeds in one process): not one run's figure
            continue
        info_path = root / ".runinfo" / Path(*parts[1:4]) / f"{parts[4]}.json"
        if not info_path.is_file():
            continue
        info = json.loads(info_path.read_text())
        timeline = info.get("timeline")
        if not timeline or info.get("resumed_from_epoch") is not None:
            continue
        before = timeline["first_step"] - record["process_start"]
        after = record["end"] - timeline["last_step"] - timeline["final_embedding_seconds"]
        rows.append({"run": folder, "before_first_step": before, "after_last_step": after,
                     "fixed": before + after, "epochs": sum(info["epoch_seconds"]), "wall": record["wall_seconds"]})
    return sorted(rows, key=lambda r: r["run"])


def print_fixed_costs(root: Path) -> None:
    rows = fixed_costs(root)
    if not rows:
        print(f"no training run records with a timeline in {root}/.runinfo (run the pipeline first)")
        return
    fixed = [r["fixed"] for r in rows]
    print(f"per-run fixed cost, {len(rows)} runs of {root}: median {statistics.median(fixed):.2f} s, "
          f"mean {statistics.mean(fixed):.2f} s, max {max(fixed):.2f} s "
          f"(before the first step: median {statistics.median(r['before_first_step'] for r in rows):.2f} s; "
          f"after the last step: median {statistics.median(r['after_last_step'] for r in rows):.2f} s)")


def _clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True)
    return into


def grid(jobs: int, serial: bool, fresh: bool) -> None:
    committed = stage_digests(yaml.safe_load((REPO / "dvc.lock").read_text()))
    base = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    commands = []
    if serial:
        commands.append(("dvc repro", [sys.executable, "-m", "dvc", "repro", "-q"]))
    launch = [sys.executable, "-m", "noisydml.tools.launch", "-j", str(jobs)]
    commands.append((f"launch -j {jobs}" + (" --fresh-processes" if fresh else ""),
                     launch + (["--fresh-processes"] if fresh else [])))
    for label, command in commands:
        root = _clone(base / label.split()[0])
        env = {**os.environ, "PYTHONPATH": str(root / "src"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("MLFLOW_TRACKING_URI", None)
        t0 = time.time()
        proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0:
            print(f"{label}: FAILED (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            continue
        regenerated = stage_digests(yaml.safe_load((root / "dvc.lock").read_text()))
        same = sum(regenerated.get(k, {}).get("outputs") == d["outputs"] for k, d in committed.items())
        print(f"{label}: {wall:.0f} s wall ({wall / 60:.1f} min) in {root}; stages whose outputs equal the "
              f"committed dvc.lock's (as CI's guard counts them): {same}/{len(committed)}")
        print_fixed_costs(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("side-by-side")
    p.add_argument("--steps", type=int, default=300)
    p = sub.add_parser("fixed-cost")
    p.add_argument("repo", nargs="?", default=".")
    p = sub.add_parser("grid")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--serial", action="store_true", help="also time a serial `dvc repro` (in its own clone)")
    p.add_argument("--fresh-processes", action="store_true", help="the launcher starts every stage as a process")
    args = parser.parse_args()
    if args.what == "side-by-side":
        side_by_side(args.steps)
    elif args.what == "fixed-cost":
        print_fixed_costs(Path(args.repo))
    else:
        grid(args.jobs, args.serial, args.fresh_processes)


if __name__ == "__main__":
    main()
