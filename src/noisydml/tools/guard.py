"""CI's guard after a `dvc repro` of the committed params: what changed, and whether that is a failure.

    noisydml guard [--tolerance .ci/tolerance.yaml] [--summary FILE]

It fails (exit 1) when

- `dvc status` is not clean, or a second `dvc repro` would run a stage;
- the committed results are stale: a stage's own inputs (its command, params and the code and reference files it
  depends on, not the data other stages make) differ from those the committed ``dvc.lock`` records, i.e. code or
  params changed without the results being regenerated and committed with them (a changed loss, a new method);
- the regenerated ``reports/all_metrics.json`` names other runs or metrics than the committed one;
- a metric differs from the committed one on the host that made the committed results (same fingerprint in
  ``reports/host.json``: CPU, libraries and ``runtime.numerics``), where the pipeline is bit-exact;
- on another host, a metric moves by more than the tolerance (``.ci/tolerance.yaml``: the spread the same commit
  shows across hosts, README "Reproducibility"): one metric beyond its kind's ``max_points``, or the mean absolute
  difference of a kind beyond its ``mean_points``.

It always prints (and appends to ``--summary``, e.g. GitHub's job summary) which case it is in, how many stage
outputs and metrics are bit-identical to the committed ones, and the largest differences per metric kind.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

METRICS = Path("reports/all_metrics.json")
HOST = Path("reports/host.json")
TOLERANCE = Path(".ci/tolerance.yaml")


def metric_kind(name: str) -> str:
    """Recall@K of every K is one kind: they move together."""
    return "recall_at_k" if name.startswith("recall_at_") else name


@dataclass
class Comparison:
    """The regenerated metrics against the committed ones (values in [0, 1]; differences reported in points)."""

    missing: list[str] = field(default_factory=list)     # "run: metric" committed but not regenerated
    extra: list[str] = field(default_factory=list)       # regenerated but not committed
    diffs: list[tuple[str, str, float, float]] = field(default_factory=list)  # run, metric, committed, new

    @property
    def compared(self) -> int:
        return len(self.diffs)

    @property
    def changed(self) -> list[tuple[str, str, float, float]]:
        return [d for d in self.diffs if d[2] != d[3]]

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """Per metric kind: metrics compared, how many differ, max and mean absolute difference (points), worst."""
        out: dict[str, dict[str, Any]] = {}
        for run, metric, old, new in self.diffs:
            k = out.setdefault(metric_kind(metric), {"n": 0, "changed": 0, "max": 0.0, "sum": 0.0, "worst": ""})
            delta = abs(new - old) * 100
            k["n"] += 1
            k["changed"] += old != new
            k["sum"] += delta
            if delta > k["max"]:
                k["max"], k["worst"] = delta, f"{run}: {metric} {old:.4f} -> {new:.4f}"
        for k in out.values():
            k["mean"] = k.pop("sum") / k["n"]
        return out


def compare(committed: dict[str, dict[str, float]], regenerated: dict[str, dict[str, float]]) -> Comparison:
    c = Comparison()
    for run in sorted(set(committed) | set(regenerated)):
        old, new = committed.get(run, {}), regenerated.get(run, {})
        for metric in sorted(set(old) | set(new)):
            if metric not in new:
                c.missing.append(f"{run}: {metric}")
            elif metric not in old:
                c.extra.append(f"{run}: {metric}")
            else:
                c.diffs.append((run, metric, float(old[metric]), float(new[metric])))
    return c


def violations(c: Comparison, same_host: bool, tolerance: dict[str, dict[str, float]]) -> list[str]:
    """Why ``c`` is a failure ([] when it is not)."""
    out = [f"committed but not regenerated: {m}" for m in c.missing[:10]]
    out += [f"regenerated but not committed: {m}" for m in c.extra[:10]]
    if same_host:
        out += [f"{run}: {metric} {old!r} -> {new!r} (this host made the committed results: they must be "
                "reproduced bit for bit)" for run, metric, old, new in c.changed[:20]]
        if c.changed:
            out.append(f"{len(c.changed)} metric(s) differ in all. A change of code or params does that (commit the "
                       "regenerated results with it), as do committed results made under other runtime settings "
                       "than the committed runtime section (regenerate them: dvc repro -f)")
        return out
    kinds = c.by_kind()
    for kind, stats in kinds.items():
        if kind not in tolerance:
            out.append(f"{kind}: no tolerance in {TOLERANCE} (add one, derived from measurement)")
            continue
        if stats["mean"] > tolerance[kind]["mean_points"]:
            out.append(f"{kind}: mean |difference| {stats['mean']:.2f} points over {stats['n']} metrics, above the "
                       f"tolerance {tolerance[kind]['mean_points']}")
    for run, metric, old, new in c.diffs:
        limit = tolerance.get(metric_kind(metric), {}).get("max_points")
        if limit is not None and abs(new - old) * 100 > limit:
            out.append(f"{run}: {metric} {old:.4f} -> {new:.4f} ({(new - old) * 100:+.2f} points), above the "
                       f"tolerance {limit}")
    return out


def load_tolerance(path: Path = TOLERANCE) -> dict[str, dict[str, float]]:
    raw = yaml.safe_load(path.read_text())
    return {kind: {"max_points": float(v["max_points"]), "mean_points": float(v["mean_points"])}
            for kind, v in raw["kinds"].items()}


def committed_file(path: Path, ref: str = "HEAD") -> dict | None:
    """``path`` as committed at ``ref`` (None when it is not in that commit)."""
    proc = subprocess.run(["git", "show", f"{ref}:{path.as_posix()}"], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _produced(lock: dict) -> list[str]:
    return [o["path"] for body in lock.get("stages", {}).values() for o in body.get("outs", [])]


def is_data(path: str, produced: list[str]) -> bool:
    """Whether a dependency is (or holds, or lies in) another stage's output: data, not an input of its own."""
    return any(path == o or path.startswith(o + "/") or o.startswith(path + "/") for o in produced)


def stage_digests(lock: dict, stages: set[str] | None = None) -> dict[str, dict[str, str]]:
    """Per stage of a dvc.lock mapping (of ``stages`` only, when given: a lock keeps the entries of stages the
    pipeline no longer has): a digest of its own inputs (command, params, and the dependencies no stage produces:
    code, references) and of its outputs."""
    # what the pipeline's stages produce (a lock keeps entries of stages that are gone; their outputs are not data)
    current = {"stages": {k: v for k, v in (lock or {}).get("stages", {}).items() if stages is None or k in stages}}
    produced = _produced(current)
    out = {}
    for stage, body in (lock or {}).get("stages", {}).items():
        if stages is not None and stage not in stages:
            continue
        own = [body.get("cmd"), body.get("params"),
               sorted((d["path"], d.get("md5")) for d in body.get("deps", []) if not is_data(d["path"], produced))]
        outs = sorted((o["path"], o.get("md5")) for o in body.get("outs", []))
        out[stage] = {"inputs": hashlib.sha256(json.dumps(own, sort_keys=True).encode()).hexdigest()[:16],
                      "outputs": hashlib.sha256(json.dumps(outs).encode()).hexdigest()[:16]}
    return out


def stale_stages(committed: dict[str, dict[str, str]], regenerated: dict[str, dict[str, str]]) -> list[str]:
    """Stages whose own inputs differ from the committed lock's (or that it lacks): their committed results were
    not made from this code and these params."""
    return sorted(s for s, d in regenerated.items() if committed.get(s, {}).get("inputs") != d["inputs"])


def _dvc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], capture_output=True, text=True, cwd=cwd)


def pipeline_stages(cwd: Path | None = None) -> set[str]:
    """The names of the pipeline's stages (``dvc stage list``)."""
    listed = _dvc("stage", "list", "--name-only", cwd=cwd)
    if listed.returncode:
        raise RuntimeError(f"dvc stage list failed: {listed.stderr.strip()}")
    return set(listed.stdout.split())


def pipeline_state() -> list[str]:
    """Failures of the pipeline's state after `dvc repro`: `dvc status` not clean, or stages a repro would run."""
    out = []
    status = _dvc("status", "--json")
    if status.returncode != 0 or json.loads(status.stdout or "{}"):
        out.append(f"dvc status is not clean after dvc repro: {status.stdout.strip() or status.stderr.strip()}")
    dry = _dvc("repro", "--dry")
    would = [line.split("'")[1] for line in dry.stdout.splitlines() if line.startswith("Running stage")]
    if dry.returncode != 0 or would:
        out.append(f"a second dvc repro would run {len(would)} stage(s): {', '.join(would[:10])}"
                   + (f" ({dry.stderr.strip()})" if dry.returncode else ""))
    return out


def report(c: Comparison, same_host: bool, committed_host: dict | None, host: dict, outputs: tuple[int, int],
           failures: list[str]) -> str:
    """The guard's verdict as Markdown."""
    lines = ["## Reproduction guard", ""]
    if same_host:
        lines.append(f"This host (`{host['id']}`) made the committed results: bit-identical metrics required.")
    else:
        made = committed_host["id"] if committed_host else "unknown (no reports/host.json committed)"
        lines.append(f"The committed results were made on host `{made}`, this is `{host['id']}` "
                     f"({host['cpu']['model']}, {', '.join(host['cpu']['isa'][-3:])}, numerics "
                     f"{host['numerics']}, {host['threads']} threads): metrics within the tolerance of "
                     f"`{TOLERANCE}` required.")
    lines += ["", f"- stage outputs bit-identical to the committed dvc.lock's: {outputs[0]} of {outputs[1]}",
              f"- metrics bit-identical: {c.compared - len(c.changed)} of {c.compared}", "",
              "| metric kind | metrics | changed | max abs diff (points) | mean abs diff (points) | largest |",
              "|---|---|---|---|---|---|"]
    for kind, s in sorted(c.by_kind().items()):
        lines.append(f"| {kind} | {s['n']} | {s['changed']} | {s['max']:.2f} | {s['mean']:.3f} | {s['worst']} |")
    lines += ["", "**FAIL**" if failures else "**PASS**", ""] + [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


def verdict(committed: dict, regenerated: dict, tolerance: dict[str, dict[str, float]],
            stages: set[str] | None = None) -> tuple[list[str], Comparison, bool, tuple[int, int]]:
    """Compare committed and regenerated results, each ``{"metrics", "host", "lock"}`` (``host`` may be None):
    the failures, the metric comparison, whether this is the host that made the committed results, and how many
    stage outputs are bit-identical."""
    same_host = committed["host"] is not None and committed["host"].get("id") == regenerated["host"]["id"]
    old, new = stage_digests(committed["lock"], stages), stage_digests(regenerated["lock"], stages)
    failures = []
    stale = stale_stages(old, new)
    if stale:
        failures.append(f"the committed results are stale for {len(stale)} stage(s) (code or params changed without "
                        f"regenerating them): {', '.join(stale[:12])}{' ...' if len(stale) > 12 else ''}; run "
                        "`dvc repro` and commit dvc.lock and reports/ with the change")
    c = compare(committed["metrics"], regenerated["metrics"])
    failures += violations(c, same_host, tolerance)
    same_outs = sum(1 for k, d in new.items() if old.get(k, {}).get("outputs") == d["outputs"])
    return failures, c, same_host, (same_outs, len(new))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="noisydml guard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tolerance", type=Path, default=TOLERANCE, help=f"default: {TOLERANCE}")
    parser.add_argument("--base", default="HEAD", help="the commit whose committed results are compared (HEAD)")
    parser.add_argument("--summary", type=Path, help="also append the verdict (Markdown) to this file")
    parser.add_argument("--skip-pipeline-state", action="store_true",
                        help="compare results only (no dvc status / dvc repro --dry)")
    args = parser.parse_args(argv)

    metrics = committed_file(METRICS, args.base)
    if metrics is None:
        print(f"error: {METRICS} is not committed at {args.base}: nothing to compare with", file=sys.stderr)
        return 2
    lock = subprocess.run(["git", "show", f"{args.base}:dvc.lock"], capture_output=True, text=True)
    committed = {"metrics": metrics, "host": committed_file(HOST, args.base),
                 "lock": yaml.safe_load(lock.stdout) if lock.returncode == 0 else {}}
    regenerated = {"metrics": json.loads(METRICS.read_text()), "host": json.loads(HOST.read_text()),
                   "lock": yaml.safe_load(Path("dvc.lock").read_text()) if Path("dvc.lock").is_file() else {}}
    failures = [] if args.skip_pipeline_state else pipeline_state()
    more, c, same_host, outputs = verdict(committed, regenerated, load_tolerance(args.tolerance),
                                          None if args.skip_pipeline_state else pipeline_stages())
    failures += more
    text = report(c, same_host, committed["host"], regenerated["host"], outputs, failures)
    print(text)
    if args.summary:
        with args.summary.open("a") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
