"""Benchmark: DVC and the launcher as the number of stages grows.

    python scripts/bench_dvc_scale.py grids [--profiles default bspml/table2 ...]
        the real pipeline (a clean clone of HEAD, its params.yaml after a profile's `-S` overrides, DVC's own code):
        stages in the graph, and the seconds of `dvc status`, `dvc dag` and the launcher's planning (DVC's index
        and graph, topological order). Nothing runs; no data is needed (`dvc repro --dry` needs the data: it
        stops at the first stage whose dependency is missing).
    python scripts/bench_dvc_scale.py synthetic [--stages 42 1000] [--jobs 2] [--repro]
        a synthetic project of N no-op stages (one source, N-2 stages that each copy it, one that lists them all,
        the shape of a grid): the same commands, then the launcher running all N (`-j`; its wall time, the time
        in the commands, the rest: the driver's overhead), `dvc status` and a `dvc repro` that has nothing to
        run, and, with --repro, `dvc repro` of the same N in a second project (DVC rewrites dvc.lock after each
        stage too).

Prints figures and the CPU; asserts nothing (README "Many runs at once" quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DVC = [sys.executable, "-m", "dvc"]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical cores"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def timed(argv: list[str], cwd: Path, env: dict | None = None) -> tuple[float, str]:
    """Seconds of one command (which must succeed) and its stdout."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {cwd} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


PLAN_CODE = """
import time, logging
t0 = time.perf_counter()
from dvc.repo import Repo
from noisydml.tools.launch import plan
t1 = time.perf_counter()
the_plan = plan(Repo("."), [])
t2 = time.perf_counter()
print(len(the_plan.order), t1 - t0, t2 - t1)
"""


def dvc_figures(root: Path) -> dict[str, float]:
    """Stages in the graph and the seconds of DVC's commands and of the launcher's plan, in ``root``."""
    figures = {}
    _, out = timed([sys.executable, "-c", PLAN_CODE], root)
    stages, imports, planning = out.split()
    figures["stages"] = int(stages)
    figures["plan: imports s"] = float(imports)
    figures["plan: index + graph s"] = float(planning)
    figures["dvc status s"], _ = timed([*DVC, "status"], root)
    figures["dvc dag s"], _ = timed([*DVC, "dag"], root)
    return figures


def show(name: str, figures: dict) -> None:
    n = figures["stages"]
    print(f"\n{name}: {n} stages")
    for key, value in figures.items():
        if key == "stages":
            continue
        per = f"  ({1000 * value / n:7.1f} ms per stage)" if key.endswith(" s") else ""
        print(f"  {key:<36} {value:9.2f}{per}")


def grids(profiles: list[str]) -> None:
    from dvc.utils.hydra import apply_overrides

    from noisydml.tools.profiles import load_profiles

    known = load_profiles(REPO / "profiles")
    for name in profiles:
        if name != "default" and name not in known:
            raise SystemExit(f"--profiles: {name!r} is not a profile; allowed: default, {', '.join(known)}")
    with tempfile.TemporaryDirectory(prefix="bench-dvc-") as folder:
        for name in profiles:
            root = Path(folder) / name.replace("/", "-")
            subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True)
            if name != "default":
                apply_overrides(root / "params.yaml", known[name]["set"])  # as `dvc exp run -S` applies them
            show(name, dvc_figures(root))


def synthetic_project(root: Path, stages: int) -> None:
    """One source stage, ``stages - 2`` copies of its output (a foreach, as the grid's matrices), one gather."""
    root.mkdir(parents=True)
    items = list(range(stages - 2))
    (root / "params.yaml").write_text(yaml.safe_dump({"runtime": {"threads": 1}, "items": items}))
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "source": {"cmd": "echo source > source.txt", "outs": ["source.txt"]},
        "copy": {"foreach": "${items}", "do": {
            "cmd": "mkdir -p copies && cp source.txt copies/${item}.txt", "deps": ["source.txt"],
            "outs": ["copies/${item}.txt"]}},
        "gather": {"cmd": "ls copies > gathered.txt", "deps": ["copies"], "outs": ["gathered.txt"]},
    }}, sort_keys=False))
    for argv in (["git", "init", "-q"], [*DVC, "init", "-q"]):
        subprocess.run(argv, cwd=root, check=True)


def launcher_figures(root: Path, jobs: int) -> dict[str, float]:
    """The launcher's wall time for the whole project, and what its log says each stage cost the driver."""
    seconds, _ = timed([sys.executable, "-m", "noisydml.tools.launch", "-j", str(jobs)], root)
    summary = json.loads((root / ".runinfo/launch/summary.json").read_text())
    ran = [s for s in summary["stages"] if s["status"] == "ran"]
    if len(ran) != len(summary["stages"]):
        raise SystemExit(f"the launcher did not run every stage in {root}")
    commands = sum(s["seconds"] for s in ran)
    return {"launch: wall s": seconds, "launch: in the commands s": commands,
            "launch: driver overhead s": seconds - commands / jobs}


def synthetic(sizes: list[int], jobs: int, repro: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-dvc-") as folder:
        for n in sizes:
            root = Path(folder) / f"launch{n}"
            synthetic_project(root, n)
            figures = dvc_figures(root)
            figures.update(launcher_figures(root, jobs))
            figures["dvc status, all done s"], _ = timed([*DVC, "status"], root)
            figures["dvc repro, nothing to run s"], _ = timed([*DVC, "repro"], root)
            figures["launch, nothing to run s"], _ = timed(
                [sys.executable, "-m", "noisydml.tools.launch", "-j", str(jobs)], root)
            # per stage: what a launch that runs them costs beyond one that only starts and checks them
            figures["launch: per stage beyond start ms"] = 1000 * (
                figures["launch: driver overhead s"] - figures["launch, nothing to run s"]) / n
            if repro:
                serial = Path(folder) / f"repro{n}"
                synthetic_project(serial, n)
                figures["dvc repro s"], _ = timed([*DVC, "repro", "-q"], serial)
            show(f"synthetic, launcher -j {jobs}", figures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    g = sub.add_parser("grids")
    g.add_argument("--profiles", nargs="+", default=["default", "bspml/table2"])
    s = sub.add_parser("synthetic")
    s.add_argument("--stages", nargs="+", type=int, default=[42, 1000])
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--repro", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "synthetic" and min(args.stages) < 3:
        parser.error(f"--stages: {min(args.stages)}; allowed: 3 or more (a source, a copy, a gather)")
    print(f"CPU: {cpu_name()}; Python {platform.python_version()}")
    if args.what == "grids":
        grids(args.profiles)
    else:
        synthetic(args.stages, args.jobs, args.repro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
