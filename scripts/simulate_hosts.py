"""Run the pipeline as other x86-64 hosts would, on this machine, and compare what they produce.

    python scripts/simulate_hosts.py run --numerics native --hosts avx2-2c avx-2c avx2-1c --workdir /tmp/hosts
    python scripts/simulate_hosts.py compare /tmp/hosts/native-avx2-2c /tmp/hosts/native-avx-2c ...
    python scripts/simulate_hosts.py hosts          # the simulated hosts
    python scripts/simulate_hosts.py fixture /tmp/hosts/native-avx-2c tests/data/guard/host_native_avx_2c.json

``run`` clones this repository's HEAD once per host into ``<workdir>/<numerics>-<host>``, sets
``runtime.numerics`` there (``native`` with ``runtime.threads: 0``, the libraries' own choice, as every host
picked before the setting existed; ``portable`` with the committed thread count) and runs ``dvc repro`` under
the host's environment, one host after the other (never two torch processes at once on 2 cores).
``fixture`` writes what CI's guard compares of a run folder (metrics, host record, per-stage digests of the lock)
as a test case of tests/test_guard.py. ``compare`` prints, against the first folder, which stage outputs (dvc.lock hashes) and how many metrics
differ, and the spread of the metrics per kind: the figures behind CI's tolerance (``.ci/tolerance.yaml``).

A simulated host is what the libraries can see of a CPU: the ISA level their dispatch picks (forced lower
through each library's own switch, the same switches a CPU without the instructions would leave them at), and
the usable cores (``taskset``: the libraries' default thread count follows the affinity mask). A CPU with
more than this one (AVX-512) cannot be simulated here; the pretrain stage on such a host is in the README.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from noisydml.tools.guard import compare, pipeline_stages, stage_digests, stale_stages  # noqa: E402

#: A CPU without AVX2 / FMA (Sandy Bridge, Ivy Bridge): every library's dispatch capped at AVX.
_AVX_ONLY = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX", "MKL_CBWR": "AVX",
             "OPENBLAS_CORETYPE": "Sandybridge", "FAISS_SIMD_LEVEL": "NONE",
             "NPY_DISABLE_CPU_FEATURES": "X86_V3 AVX2 FMA3 X86_V4 AVX512_ICL AVX512_SPR"}
HOSTS = {
    "avx2-2c": ({}, None, "this machine: AVX2 + FMA, 2 cores"),
    "avx-2c": (_AVX_ONLY, None, "a CPU without AVX2/FMA, 2 cores: every library's dispatch capped at AVX"),
    "avx2-1c": ({}, "0", "one usable core (taskset -c 0): the libraries' default thread count is 1"),
    # what a shared cluster's environment often presets; portable must replace all of it
    "preset-env": ({**_AVX_ONLY, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                    "MKL_CBWR": "COMPATIBLE"}, None,
                   "2 cores, an environment presetting 1 thread per pool and every library's lowest path"),
}


def run(numerics: str, hosts: list[str], workdir: Path, cpus_override: str | None = None) -> None:
    for name in hosts:
        env_add, cpus, about = HOSTS[name]
        if cpus is not None and cpus_override is not None:
            cpus = cpus_override  # the same host on another core (two one-core hosts can run side by side)
        root = workdir / f"{numerics}-{name}"
        if root.exists():
            shutil.rmtree(root)
        subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True)
        params_path = root / "params.yaml"
        text = params_path.read_text()
        runtime = yaml.safe_load(text)["runtime"]
        threads = 0 if numerics == "native" else runtime["threads"]
        text = _set_line(text, "numerics", numerics)
        text = _set_line(text, "threads", str(threads))
        params_path.write_text(text)
        # the clone's own code (not this checkout's, which may change meanwhile), its own MLflow database
        env = {**os.environ, **env_add, "PYTHONPATH": str(root / "src"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
        cmd = [sys.executable, "-m", "dvc", "repro"]
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        print(f"{root.name}: {about}; runtime.numerics={numerics}, threads={threads}", flush=True)
        start = time.time()
        with (root / "repro.log").open("w") as log:
            status = subprocess.run(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        seconds = time.time() - start
        (root / "simulated_host.json").write_text(json.dumps(
            {"host": name, "about": about, "env": env_add, "cpus": cpus, "numerics": numerics, "threads": threads,
             "repro_seconds": round(seconds, 1), "status": status}, indent=1) + "\n")
        print(f"{root.name}: dvc repro exit {status} in {seconds:.0f} s", flush=True)


def _set_line(text: str, key: str, value: str) -> str:
    """Set ``runtime.<key>`` in params.yaml's text, keeping its comments (the key is unique under runtime)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("runtime:"))
    for i in range(start + 1, len(lines)):
        if lines[i].startswith(f"  {key}:"):
            comment = lines[i][lines[i].find("#"):] if "#" in lines[i] else "\n"
            lines[i] = f"  {key}: {value}".ljust(29) + comment
            return "".join(lines)
    raise KeyError(f"runtime.{key} not found in params.yaml")


def compare_folders(folders: list[Path]) -> None:
    base = folders[0]
    base_metrics = json.loads((base / "reports" / "all_metrics.json").read_text())
    stages = pipeline_stages(base)
    base_digests = stage_digests(yaml.safe_load((base / "dvc.lock").read_text()), stages)
    print(f"against {base.name}:")
    for other in folders[1:]:
        info = json.loads((other / "simulated_host.json").read_text())
        digests = stage_digests(yaml.safe_load((other / "dvc.lock").read_text()), stages)
        differ = sorted(k for k, d in digests.items() if base_digests.get(k, {}).get("outputs") != d["outputs"])
        kinds = {}
        for stage in differ:
            kinds[stage.split("@")[0]] = kinds.get(stage.split("@")[0], 0) + 1
        c = compare(base_metrics, json.loads((other / "reports" / "all_metrics.json").read_text()))
        print(f"\n{other.name} ({info['about']}; dvc repro {info['repro_seconds']:.0f} s, exit {info['status']})")
        stale = stale_stages(base_digests, digests)
        if stale:
            print(f"  NOT THE SAME CODE/PARAMS for {len(stale)} stage(s): {', '.join(stale)}")
        print(f"  stages whose outputs differ: {len(differ)} of {len(digests)}"
              + (f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if differ else ""))
        print(f"  metrics differing: {len(c.changed)} of {c.compared}")
        print(f"  {'kind':<30} {'n':>4} {'changed':>8} {'max |d| pts':>12} {'mean |d| pts':>13}  largest")
        for kind, s in sorted(c.by_kind().items()):
            print(f"  {kind:<30} {s['n']:>4} {s['changed']:>8} {s['max']:>12.2f} {s['mean']:>13.3f}  {s['worst']}")
    print("\nrepro seconds: " + ", ".join(
        f"{f.name} {json.loads((f / 'simulated_host.json').read_text())['repro_seconds']:.0f}" for f in folders))


def spread(named: list[str], margin: float) -> None:
    """Per metric kind, over every pair of runs of the same commit on different hosts: the largest and the mean
    absolute difference (points), and the tolerance they give: each figure's worst pair times ``margin``, rounded
    up to a quarter point (the numbers behind .ci/tolerance.yaml)."""
    runs = {}
    for item in named:
        label, _, path = item.partition("=")
        runs[label] = json.loads(Path(path).read_text())
    worst: dict[str, dict[str, tuple[float, str]]] = {}
    labels = list(runs)
    print(f"{'pair':<40} {'kind':<28} {'changed':>8} {'max pts':>8} {'mean pts':>9}")
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            for kind, s in sorted(compare(runs[a], runs[b]).by_kind().items()):
                print(f"{a + ' / ' + b:<40} {kind:<28} {s['changed']:>4}/{s['n']:<3} {s['max']:>8.2f} {s['mean']:>9.3f}")
                w = worst.setdefault(kind, {"max": (0.0, ""), "mean": (0.0, "")})
                for stat in ("max", "mean"):
                    if s[stat] > w[stat][0]:
                        w[stat] = (s[stat], f"{a} / {b}")
    print("\nkinds:  # worst pair x margin %.2f, rounded up to 0.25 point" % margin)
    for kind, w in sorted(worst.items()):
        up = {stat: math.ceil(w[stat][0] * margin * 4) / 4 for stat in ("max", "mean")}
        print(f"  {kind}: {{max_points: {up['max']}, mean_points: {up['mean']}}}"
              f"  # max {w['max'][0]:.2f} ({w['max'][1]}), mean {w['mean'][0]:.3f} ({w['mean'][1]})")


def fixture(folder: Path, out: Path) -> None:
    """A guard test case from a finished folder: its metrics, host record and stage digests."""
    stages = pipeline_stages(folder)
    case = {"about": json.loads((folder / "simulated_host.json").read_text())["about"],
            "metrics": json.loads((folder / "reports" / "all_metrics.json").read_text()),
            "host": json.loads((folder / "reports" / "host.json").read_text()),
            "stages": stage_digests(yaml.safe_load((folder / "dvc.lock").read_text()), stages)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(case, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(case['metrics'])} runs, {len(case['stages'])} stages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="dvc repro of HEAD under each simulated host")
    r.add_argument("--numerics", choices=("portable", "native"), required=True)
    r.add_argument("--hosts", nargs="+", choices=sorted(HOSTS), required=True)
    r.add_argument("--workdir", type=Path, required=True)
    r.add_argument("--cpus", help="for a one-core host: which core (taskset -c), e.g. 1 to run beside one on core 0")
    c = sub.add_parser("compare", help="outputs and metrics of run folders against the first")
    c.add_argument("folders", nargs="+", type=Path)
    sub.add_parser("hosts", help="list the simulated hosts")
    sp = sub.add_parser("spread", help="per-kind spread over every pair of metrics files (LABEL=reports/all_metrics.json)")
    sp.add_argument("runs", nargs="+", metavar="LABEL=PATH")
    sp.add_argument("--margin", type=float, default=1.5)
    f = sub.add_parser("fixture", help="a finished folder as a test case of CI's guard")
    f.add_argument("folder", type=Path)
    f.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.numerics, args.hosts, args.workdir, args.cpus)
    elif args.command == "compare":
        compare_folders(args.folders)
    elif args.command == "spread":
        spread(args.runs, args.margin)
    elif args.command == "fixture":
        fixture(args.folder, args.out)
    else:
        for name, (env, cpus, about) in HOSTS.items():
            print(f"{name:<12} {about}" + (f"; taskset -c {cpus}" if cpus else "") + (f"; {env}" if env else ""))


if __name__ == "__main__":
    main()
