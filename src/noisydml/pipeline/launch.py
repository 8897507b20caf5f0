"""Run the pipeline's stale stages at once on a Ray cluster: ``python -m noisydml.pipeline.launch -j N``.

DVC has no parallel ``dvc repro``. This launcher asks DVC (its Python API: the stage graph and each stage's
``changed()``) which stages are stale, runs each stage's own command unchanged as a Ray task once every stage it
depends on is done, and records each finished stage in ``dvc.lock`` from this driver process, one at a time, the
way ``dvc repro`` does (``Stage.save``, ``Stage.commit``, ``Stage.dump``; the run cache too). Afterwards
``dvc status`` is clean and ``dvc repro`` does nothing; the outputs are those a serial ``dvc repro`` makes (the
stage commands are the same, and ``runtime.numerics: portable`` fixes every run's threads, whatever runs beside it).

Where: this machine by default (a local Ray instance offering ``-j`` runs at once); ``--address`` joins a cluster
started with ``ray start`` (the repository on a shared filesystem, at the same path on every node; README
"Many runs at once").

Resources: a task asks Ray for ``runtime.threads x runtime.processes`` CPUs, and a training task (train,
pretrain, timing stages) for ``runtime.processes`` GPUs when ``runtime.device`` is ``cuda``, or ``auto`` on a
cluster with GPUs (Ray sets ``CUDA_VISIBLE_DEVICES``). Waiting OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``)
unless the environment says otherwise: spinning threads of two processes on the same cores starve each other.

Faults: a task whose worker process dies (killed, node lost) is retried by Ray (``--retries``); the stage process
dies with its worker and the retry resumes a training run from its last checkpoint (bit-exactly). A stage whose
command fails stops the stages that depend on it, not the others; the exit status is 1 and the summary says which
failed and which did not run. Ctrl-C cancels the running tasks and commits nothing of theirs: the next launch, or
``dvc repro``, runs them again (training runs resume from their checkpoints).

Each stage's output goes to ``.runinfo/launch/<stage>.log``; the last launch's summary to
``.runinfo/launch/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Stage scripts that train a network (they may use GPUs; everything else runs on CPUs).
TRAINING_SCRIPTS = ("stages/train.py", "stages/pretrain.py", "stages/timing.py")
LOG_DIR = Path(".runinfo") / "launch"


class LaunchError(RuntimeError):
    """The launch cannot start (no Ray, no DVC repository, a bad option)."""


# ----------------------------------------------------------------------------------------------------- the task


def _die_with_parent() -> None:
    """In the stage process (Linux): be killed when the Ray worker that started it dies, so that a retried task
    never runs beside a leftover of its first attempt."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_stage_command(name: str, cmd: str, wdir: str, outs: list[str], env: dict[str, str], log: str) -> dict:
    """A Ray task: run one stage's command as ``dvc repro`` would (in its folder, with ``DVC_ROOT`` and
    ``DVC_STAGE``, after removing its outputs that are not ``persist``), its output to ``log``.

    Returns its exit status, host and seconds. Runs again from the start when Ray retries it after a worker died
    (outputs removed again; a training run resumes from its checkpoint, which lies outside its outputs)."""
    import shutil

    started = time.time()
    for out in outs:  # DVC's Stage.remove_outs, redone by every attempt
        path = Path(out)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    full_env = {**os.environ, **env}
    # stages run the cluster's interpreter (`python` in a stage command is this worker's)
    full_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full_env.get('PATH', '')}"
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.run(command_argv(cmd), cwd=wdir, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                              preexec_fn=_die_with_parent)
    return {"returncode": proc.returncode, "host": f"{socket.gethostname()}:{_node_id()}",
            "seconds": time.time() - started}


def command_argv(cmd: str) -> list[str]:
    """A stage command as the argument list to start: a simple command (every stage of this pipeline) is started
    itself, not under a shell, so that it dies with its Ray worker (a shell's children would not: the
    parent-death signal is not inherited); anything using the shell's syntax goes to ``/bin/sh -c``."""
    if re.search(r"[;&|<>$`(){}*?~\n\\'\"]", cmd):
        return ["/bin/sh", "-c", cmd]
    return shlex.split(cmd)


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()[:8]
    except Exception:  # noqa: BLE001 - a label only
        return "-"


# ---------------------------------------------------------------------------------------------------- the driver


@dataclass
class Outcome:
    """What became of one stage in this launch."""

    stage: str
    status: str  # ran | restored (run cache) | unchanged | failed | not run | cancelled
    host: str = ""
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Running:
    stage: Any
    ref: Any
    started: float
    log: Path


@dataclass
class Plan:
    """The stages of the launch in dependency order and, for each, the stages it needs."""

    order: list = field(default_factory=list)
    needs: dict = field(default_factory=dict)


def plan(repo, targets: list[str]) -> Plan:
    """Every stage of ``targets`` (all stages when empty) and what it depends on, upstream first (DVC's graph:
    an edge runs from a stage to a stage it depends on)."""
    import networkx as nx

    graph = repo.index.graph
    if targets:
        chosen = set()
        for target in targets:
            for stage in repo.stage.collect(target):
                chosen |= {stage, *nx.descendants(graph, stage)}
        graph = graph.subgraph(chosen)
    order = [s for s in reversed(list(nx.topological_sort(graph)))]
    return Plan(order=order, needs={s: set(graph.successors(s)) for s in order})


def stage_resources(stage, runtime: dict, cluster_gpus: float) -> dict:
    """Ray resources of one stage's task (module docstring)."""
    processes = runtime["processes"]
    cpus = max(1, runtime["threads"]) * processes
    trains = any(script in (stage.cmd if isinstance(stage.cmd, str) else " ".join(stage.cmd))
                 for script in TRAINING_SCRIPTS)
    wants_gpu = runtime["device"] == "cuda" or (runtime["device"] == "auto" and cluster_gpus > 0)
    return {"num_cpus": cpus, "num_gpus": processes if trains and wants_gpu else 0}


def task_env(tracking_uri: str | None) -> dict[str, str]:
    """What every stage process gets besides the worker's environment."""
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        env["MLFLOW_TRACKING_URI"] = uri
    return env


def _log_path(root: Path, name: str) -> Path:
    return root / LOG_DIR / (re.sub(r"[^A-Za-z0-9_.@-]+", "_", name) + ".log")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Launcher:
    """Schedules a :class:`Plan` on Ray and keeps ``dvc.lock`` up to date, one stage at a time."""

    def __init__(self, repo, runtime: dict, *, tracking_uri: str | None, retries: int, echo=print):
        import ray

        self.ray = ray
        self.repo = repo
        self.runtime = runtime
        self.env = task_env(tracking_uri)
        self.retries = retries
        self.echo = echo
        self.root = Path(repo.root_dir)
        self.cluster_gpus = ray.cluster_resources().get("GPU", 0)
        self.task = ray.remote(run_stage_command)
        self.outcomes: dict[Any, Outcome] = {}

    def _start(self, stage) -> Running | Outcome:
        """Prepare ``stage`` under DVC's lock as ``dvc repro`` does; a run-cache hit is restored here, otherwise
        the command is submitted to Ray."""
        from dvc.stage.cache import RunCacheNotFoundError

        with self.repo.lock:
            if not stage.changed():
                return Outcome(stage.addressing, "unchanged")
            stage.remove_outs(ignore_remove=False, force=False)
            try:
                self.repo.stage_cache.restore(stage)
                stage.save(run_cache=False)
                stage.commit()
                stage.dump(update_pipeline=False)
                return Outcome(stage.addressing, "restored", detail="run cache")
            except RunCacheNotFoundError:
                stage.save_deps()
        log = _log_path(self.root, stage.addressing)
        outs = [out.fs_path for out in stage.outs if not out.persist]
        cmd = stage.cmd if isinstance(stage.cmd, str) else " && ".join(stage.cmd)
        ref = self.task.options(**stage_resources(stage, self.runtime, self.cluster_gpus),
                                max_retries=self.retries, retry_exceptions=False, name=stage.addressing).remote(
            stage.addressing, cmd, stage.wdir, outs, {**self.env, "DVC_ROOT": str(self.root),
                                                      "DVC_STAGE": stage.addressing}, str(log))
        return Running(stage, ref, time.time(), log)

    def _finish(self, running: Running, result: dict) -> Outcome:
        """Record a finished command: its outputs saved and cached and its ``dvc.lock`` entry written, as
        ``dvc repro`` does after running it."""
        stage = running.stage
        if result["returncode"] != 0:
            return Outcome(stage.addressing, "failed", result["host"], result["seconds"],
                           f"exit {result['returncode']}; log {running.log}")
        with self.repo.lock:
            no_cache_outs = any(not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot))
            stage.save(run_cache=not no_cache_outs)
            stage.commit()
            stage.dump(update_pipeline=False)
        return Outcome(stage.addressing, "ran", result["host"], result["seconds"])

    def run(self, the_plan: Plan) -> list[Outcome]:
        ray = self.ray
        waiting = list(the_plan.order)
        running: dict[Any, Running] = {}
        total = len(waiting)
        last_beat = time.time()
        try:
            while waiting or running:
                for stage in list(waiting):
                    needs = the_plan.needs[stage]
                    if any(n in waiting or any(r.stage is n for r in running.values()) for n in needs):
                        continue
                    waiting.remove(stage)
                    broken = [n.addressing for n in needs if self.outcomes[n].status in ("failed", "not run")]
                    if broken:
                        self.outcomes[stage] = Outcome(stage.addressing, "not run", detail=f"needs {broken[0]}")
                        self.echo(f"not run    {stage.addressing} (needs {broken[0]}, which did not finish)")
                        continue
                    started = self._start(stage)
                    if isinstance(started, Outcome):
                        self.outcomes[stage] = started
                        if started.status == "restored":
                            self.echo(f"restored   {stage.addressing} (run cache)")
                        continue
                    running[started.ref] = started
                    self.echo(f"started    {stage.addressing}")
                if not running:
                    continue
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for ref in done:
                    item = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - retries exhausted, node lost: the stage failed
                        result = {"returncode": -1, "host": "-", "seconds": time.time() - item.started,
                                  "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    outcome = self._finish(item, result)
                    if "error" in result:
                        outcome.detail = result["error"]
                    self.outcomes[item.stage] = outcome
                    finished = sum(o.status in ("ran", "failed") for o in self.outcomes.values())
                    self.echo(f"{outcome.status:<10} {outcome.stage} on {outcome.host} in {outcome.seconds:.1f} s"
                              f" [{finished} finished, {len(running)} running, {len(waiting)} waiting of {total}]")
                    if outcome.status == "failed":
                        self.echo("\n".join([f"  {outcome.detail}", *("  | " + line for line in
                                                                       _tail(item.log).splitlines())]))
                if time.time() - last_beat > 60 and running:
                    last_beat = time.time()
                    for item in running.values():
                        self.echo(f"running    {item.stage.addressing}: {time.time() - item.started:.0f} s")
        except KeyboardInterrupt:
            for ref, item in running.items():
                ray.cancel(ref, force=True)
                self.outcomes[item.stage] = Outcome(item.stage.addressing, "cancelled",
                                                    seconds=time.time() - item.started)
            for stage in waiting:
                self.outcomes[stage] = Outcome(stage.addressing, "not run", detail="interrupted")
            raise
        return [self.outcomes[s] for s in the_plan.order]


def summary_table(outcomes: list[Outcome]) -> str:
    from tabulate import tabulate

    rows = [(o.stage, o.host, f"{o.seconds:.1f}" if o.seconds else "", o.status, o.detail)
            for o in outcomes if o.status != "unchanged"]
    unchanged = sum(o.status == "unchanged" for o in outcomes)
    table = tabulate(rows, headers=("stage", "host", "seconds", "status", "detail"), tablefmt="simple") if rows else ""
    return f"{table}\n{unchanged} stage(s) unchanged" if table else f"{unchanged} stage(s) unchanged; nothing to run"


def write_summary(root: Path, outcomes: list[Outcome], wall: float, jobs: int | None, address: str | None) -> Path:
    path = root / LOG_DIR / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"wall_seconds": wall, "jobs": jobs, "address": address,
                               "stages": [o.__dict__ for o in outcomes]}, indent=1) + "\n")
    tmp.replace(path)
    return path


def init_ray(jobs: int, address: str | None, runtime: dict):
    """Join the cluster at ``address``, or start a local Ray instance offering ``jobs`` runs of
    ``runtime.threads x runtime.processes`` CPUs each."""
    try:
        import ray
    except ImportError as e:
        raise LaunchError("the launcher needs Ray: pip install 'ray>=2.40'") from e
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="WARNING")
    if address:
        ray.init(address=address, **kwargs)
    else:
        cpus = jobs * max(1, runtime["threads"]) * runtime["processes"]
        ray.init(num_cpus=cpus, object_store_memory=128 * 1024**2, **kwargs)
    return ray


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m noisydml.pipeline.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="stages (as `dvc repro` takes them) and what they need; "
                                                   "default: the whole pipeline")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="local Ray instance: runs at once (default: this machine's cores / runtime.threads, "
                             "at least 1); not with --address")
    parser.add_argument("--address", help="a Ray cluster started with `ray start` (e.g. auto, or HEAD_IP:6379)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI for every run (e.g. http://HEAD:5000 of an "
                                               "`mlflow server`; default: MLFLOW_TRACKING_URI, else the "
                                               "repository's mlflow.db)")
    parser.add_argument("--retries", type=int, default=3,
                        help="times Ray retries a task whose worker died (default 3; a failing command is not retried)")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.address:
        parser.error("-j/--jobs sizes a local Ray instance; a cluster's size is its `ray start` options")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"-j/--jobs: {args.jobs}; allowed: 1 or more")

    import logging

    from dvc.repo import Repo

    from noisydml.config import read_params_file
    from noisydml.runtime import runtime_settings

    runtime = runtime_settings(read_params_file(args.params).get("runtime"))
    cores = os.cpu_count() or 1
    jobs = args.jobs if args.jobs is not None else max(1, cores // max(1, runtime["threads"]))
    started = time.time()
    logging.getLogger("dvc").setLevel(logging.WARNING)  # DVC's "Updating lock file" lines between ours
    repo = Repo(".")
    the_plan = plan(repo, args.targets)
    ray = init_ray(jobs, args.address, runtime)
    where = args.address or f"this machine, {jobs} at once"
    print(f"launch: {len(the_plan.order)} stages in the graph; Ray on {where}", flush=True)
    launcher = Launcher(repo, runtime, tracking_uri=args.tracking_uri, retries=args.retries,
                        echo=lambda line: print(line, flush=True))
    try:
        outcomes = launcher.run(the_plan)
    except KeyboardInterrupt:
        outcomes = [launcher.outcomes.get(s, Outcome(s.addressing, "not run")) for s in the_plan.order]
        print("\ninterrupted: finished stages are recorded in dvc.lock; the next launch (or `dvc repro`) runs "
              "the rest, training runs resume from their checkpoints", flush=True)
        print(summary_table(outcomes))
        write_summary(repo.root_dir and Path(repo.root_dir), outcomes, time.time() - started, jobs, args.address)
        ray.shutdown()
        return 130
    ray.shutdown()
    wall = time.time() - started
    print(summary_table(outcomes))
    write_summary(Path(repo.root_dir), outcomes, wall, None if args.address else jobs, args.address)
    failed = [o.stage for o in outcomes if o.status == "failed"]
    skipped = [o.stage for o in outcomes if o.status == "not run"]
    print(f"launch: {wall:.1f} s wall", flush=True)
    if failed:
        print(f"launch: FAILED {', '.join(failed)}; not run (they need a failed stage): "
              f"{', '.join(skipped) or 'none'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
