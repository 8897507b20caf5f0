"""Run the pipeline's stale stages at once on a Ray cluster: ``noisydml launch -j N``.

DVC has no parallel ``dvc repro``. This launcher asks DVC (its Python API: the stage graph and each stage's
``changed()``) which stages are stale, runs each stage's command as a Ray task once every stage it depends on is
done, and records each finished stage from this driver process the way ``dvc repro`` does (``Stage.save``,
``Stage.commit``: its outputs hashed and cached, the run cache too), then its ``dvc.lock`` entry with DVC's own
writer. ``dvc.lock`` is rewritten whole (parsed and dumped by ruamel.yaml), which costs in proportion to its
length: once per stage, 300 no-op stages took 608 s, almost all in those rewrites. So the entries are written in
batches (:class:`LockWriter`): at once when the driver is waiting (the usual case with real stages, which take
minutes), and under a burst of short stages when the stages waiting to be written reach a tenth of the lock:
the rewrites then cost in proportion to the number of stages, not its square. Afterwards ``dvc status``
is clean and ``dvc repro`` does nothing; the outputs are those a serial ``dvc repro`` makes (the stage commands
are the same, and ``runtime.numerics: portable`` fixes every run's threads, whatever runs beside it).

This pipeline's commands (``python stages/<x>.py ...``) run inside Ray's worker processes, which keep their
imports from one stage to the next (a training run's fixed cost falls from ~7 s to ~0.5 s on 2 cores); Ray
creates them with the pinned numerics environment (:func:`noisydml.numerics.environment`).
``--fresh-processes`` starts every command as a new process instead; other commands always are.

Where: this machine by default (a local Ray instance offering ``-j`` runs at once); ``--address`` joins a cluster
started with ``ray start`` (the repository on a shared filesystem, at the same path on every node; README
"Many runs at once").

Resources: a task asks Ray for ``runtime.threads x runtime.processes`` CPUs, and a training task (train,
pretrain, timing stages) for ``runtime.processes`` GPUs when ``runtime.device`` is ``cuda``, or ``auto`` on a
cluster with GPUs (Ray sets ``CUDA_VISIBLE_DEVICES``). Where stages share cores (``-j`` x their threads above
this machine's cores, or any cluster), waiting OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``, unless the
environment sets a policy): spinning threads of two processes on the same cores starve each other.

Faults: a task whose worker process dies (killed, node lost) is retried by Ray (``--retries``); the stage process
dies with its worker and the retry resumes a training run from its last checkpoint (bit-exactly). A stage whose
command fails stops the stages that depend on it, not the others; the exit status is 1 and the summary says which
failed and which did not run. Ctrl-C (or SIGTERM) cancels the running tasks and commits nothing of theirs: the next
launch, or ``dvc repro``, runs them again (training runs resume from their checkpoints); the finished stages are
written to ``dvc.lock`` before it exits. A launcher killed outright (SIGKILL) loses the lock entries of its last
batch only: their outputs and runs are in DVC's cache and run cache, so the next launch restores them
("restored (run cache)") instead of running them.

Each stage's output goes to ``.runinfo/launch/<stage>.log``; the last launch's summary to
``.runinfo/launch/summary.json``.
"""

from __future__ import annotations

import argparse
import contextlib
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

from noisydml import io

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


def run_stage_command(name: str, cmd: str, wdir: str, outs: list[str], env: dict[str, str], log: str,
                      warm: bool) -> dict:
    """A Ray task: run one stage's command as ``dvc repro`` would (in its folder, with ``DVC_ROOT`` and
    ``DVC_STAGE``, after removing its outputs that are not ``persist``), its output to ``log``.

    ``warm``: a command ``python stages/<x>.py ...`` runs in this worker process, which keeps its imports from
    one stage to the next (torch's alone take seconds); the worker was created with the pinned numerics
    environment, so the libraries took the same code paths as in a new process. Otherwise the command runs as
    a new process. Returns its exit status, host and seconds. Runs again from the start when Ray retries it
    after a worker died (outputs removed again; a training run resumes from its checkpoint, which lies outside
    its outputs)."""
    import shutil

    started = time.time()
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    Path(log).write_text("")  # the driver sees the stage running
    for out in outs:  # DVC's Stage.remove_outs, redone by every attempt
        path = Path(out)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    argv = command_argv(cmd)
    script = stage_script(argv, wdir)
    if warm and script is not None:
        from noisydml.runtime import STAGE_STARTED

        code = _run_in_this_process(script, argv[2:], wdir, {**env, STAGE_STARTED: repr(started)}, log)
    else:
        full_env = {**os.environ, **env}
        # stages run the cluster's interpreter (`python` in a stage command is this worker's)
        full_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{full_env.get('PATH', '')}"
        with open(log, "w") as out:
            code = subprocess.run(argv, cwd=wdir, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                  preexec_fn=_die_with_parent).returncode
    return {"returncode": code, "host": f"{socket.gethostname()}:{_node_id()}", "seconds": time.time() - started}


def stage_script(argv: list[str], wdir: str) -> str | None:
    """``stages/<x>.py`` when the command is ``python stages/<x>.py ...`` (a stage script of this pipeline),
    else None."""
    if len(argv) >= 2 and argv[0] == "python" and re.fullmatch(r"stages/\w+\.py", argv[1]) \
            and (Path(wdir) / argv[1]).is_file():
        return argv[1]
    return None


def _run_in_this_process(script: str, args: list[str], wdir: str, env: dict[str, str], log: str) -> int:
    """Run a stage script as ``__main__`` here, as ``python script args`` would in ``wdir``, its stdout and
    stderr (the file descriptors: C libraries' output too) to ``log``; restore the process after. Returns
    the exit status the process would have had."""
    import runpy
    import traceback

    saved = {"cwd": os.getcwd(), "argv": sys.argv, "path": list(sys.path),
             "env": {k: os.environ.get(k) for k in env}}
    sys.stdout.flush()
    sys.stderr.flush()
    fds = os.dup(1), os.dup(2)
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    try:
        os.chdir(wdir)
        os.environ.update(env)
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(wdir) / Path(script).parent))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the stage failed: its traceback goes to its log, as python's would
            traceback.print_exc()
            code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        os.chdir(saved["cwd"])
        sys.argv = saved["argv"]
        sys.path[:] = saved["path"]
        for key, value in saved["env"].items():
            if value is None:
                os.environ.pop(key, None)
            elif os.environ.get(key) != value:
                os.environ[key] = value
    return code


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
    ended_at: float = 0.0  # seconds since the epoch (the summary's timeline)
    tracking_warnings: list = field(default_factory=list)  # lines of its log saying a run went untracked


@dataclass
class Running:
    stage: Any
    ref: Any
    submitted: float
    log: Path
    started: float | None = None  # when its task began (its log appeared)
    read: int = 0  # how much of its log the driver has read (epoch lines)


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


def task_env(tracking_uri: str | None, shared_cores: bool) -> dict[str, str]:
    """What every stage gets besides the worker's environment: ``OMP_WAIT_POLICY=PASSIVE`` where stages may
    share cores (unless the environment sets a policy), MLflow's tracking URI."""
    env = {}
    if "OMP_WAIT_POLICY" in os.environ:
        env["OMP_WAIT_POLICY"] = os.environ["OMP_WAIT_POLICY"]
    elif shared_cores:
        # measured (scripts/bench_launch.py side-by-side, 2 cores, 2 threads each): two trainings at once with
        # spinning waits ran 3.6 steps/s each against 33 alone; with PASSIVE 20.5 each (41 together). Alone,
        # PASSIVE cost ~18% (27 steps/s), so it is set only where stages share cores.
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        env["MLFLOW_TRACKING_URI"] = uri
    return env


def worker_env(runtime: dict, stage_env: dict[str, str]) -> dict[str, str]:
    """The environment Ray creates the worker processes with: the pinned numerics (``runtime``), so that the
    libraries a warm worker loads take the pinned code paths (``noisydml.numerics``), and what every stage gets."""
    from noisydml import numerics

    return {**numerics.environment(runtime), numerics.PINNED_AT_START: "1", **stage_env}


def _log_path(root: Path, name: str) -> Path:
    return root / LOG_DIR / (re.sub(r"[^A-Za-z0-9_.@-]+", "_", name) + ".log")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def tracking_warnings(log: Path) -> list[str]:
    """The lines of a stage's log that say a training run went untracked (noisydml.tracking's warnings)."""
    from noisydml.tracking import TRACKING_WARNING

    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in re.split(r"[\r\n]", text) if line.strip().startswith(TRACKING_WARNING)]


def epoch_lines(text: str) -> list[str]:
    """The trainer's per-epoch rows in a piece of a stage's log (``epoch=N loss=... epoch_seconds=S``, between
    progress bars' carriage returns), each as one short line: epoch, loss, monitoring P@1 when logged, seconds."""
    lines, total = [], None
    for segment in re.split(r"[\r\n]", text):
        segment = segment.strip()
        if bar := re.search(r"epoch \d+/(\d+):", segment):  # the progress bar before it names the epochs
            total = bar.group(1)
        if not segment.startswith("epoch=") or "epoch_seconds=" not in segment:
            continue
        row = dict(item.split("=", 1) for item in segment.split() if "=" in item)
        short = [f"epoch {row['epoch']}" + (f"/{total}" if total else ""), f"loss {row.get('loss', '-')}"]
        if "test_precision_at_1" in row:
            short.append(f"monitor P@1 {float(row['test_precision_at_1']) * 100:.1f}")
        if "val_precision_at_1" in row:
            short.append(f"validation P@1 {float(row['val_precision_at_1']) * 100:.1f}")
        lines.append(", ".join(short) + f" ({row['epoch_seconds']} s)")
    return lines


def last_durations(root: Path) -> dict[str, float]:
    """Seconds each stage took when it last ran (earlier launches' summaries, ``.runinfo/launch/durations.json``)."""
    try:
        return json.loads((root / LOG_DIR / "durations.json").read_text())
    except (OSError, ValueError):
        pass
    try:  # a repository launched before durations.json existed: its last summary
        stages = json.loads((root / LOG_DIR / "summary.json").read_text())["stages"]
        return {s["stage"]: s["seconds"] for s in stages if s["status"] == "ran"}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _record(stage, run_cache: bool) -> None:
    """What ``Stage.run`` and ``dvc repro`` do once a stage's outputs are in place (under DVC's lock), but for
    its ``dvc.lock`` entry (:class:`LockWriter`): hash and cache them (and the run, with ``run_cache``)."""
    stage.save(run_cache=run_cache)
    stage.commit()


class LockWriter:
    """The ``dvc.lock`` entries of recorded stages, written in batches by DVC's own ``dump_stages`` (one parse
    and one dump of the file per batch; module docstring).

    ``due(idle)``: a batch is due when the driver is idle (waiting for running stages) or when the stages
    waiting to be written reach ``BURST_FRACTION`` of those written (so that a burst of N short stages rewrites
    the file O(log N) times, each rewrite O(N))."""

    BURST_FRACTION = 0.1

    def __init__(self, repo, already_written: int):
        self.repo = repo
        self.written = already_written
        self.unwritten: list = []

    def add(self, stage) -> None:
        self.unwritten.append(stage)

    def due(self, idle: bool) -> bool:
        return bool(self.unwritten) and (idle or len(self.unwritten) >= max(1.0, self.BURST_FRACTION * self.written))

    def write(self) -> None:
        """Write every waiting entry (under DVC's lock), grouped by the dvc.yaml that defines the stage.

        DVC rewrites dvc.lock in place: a Ctrl-C or SIGTERM in the middle left it cut short (seen: a launch
        interrupted twice in a row lost 18 of 43 entries). So the two signals wait until the file is whole and
        are raised after it (as KeyboardInterrupt, as the launcher's handlers do). Call from the main thread."""
        if not self.unwritten:
            return
        by_file: dict[str, list] = {}
        for stage in self.unwritten:
            by_file.setdefault(stage.dvcfile.path, []).append(stage)
        with _signals_deferred():
            with self.repo.lock:
                for stages in by_file.values():
                    stages[0].dvcfile.dump_stages(stages, update_pipeline=False)
            self.written += len(self.unwritten)
            self.unwritten = []


@contextlib.contextmanager
def _signals_deferred(signals=(signal.SIGINT, signal.SIGTERM)):
    """Hold SIGINT and SIGTERM for the block (Python runs signal handlers in the main thread, so a handler
    that only notes the signal holds them whichever thread the OS delivered them to); then raise
    KeyboardInterrupt if one came."""
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        raise KeyboardInterrupt(f"signal {caught[0]} during the dvc.lock write (held until it was whole)")


class Launcher:
    """Schedules a :class:`Plan` on Ray and keeps ``dvc.lock`` up to date, one stage at a time."""

    def __init__(self, repo, runtime: dict, *, tracking_uri: str | None, retries: int, warm: bool = True,
                 shared_cores: bool = True, echo=print, slots: int = 1, durations: dict | None = None,
                 epochs: bool = True):
        import ray

        self.ray = ray
        self.repo = repo
        self.runtime = runtime
        self.env = task_env(tracking_uri, shared_cores)
        self.runtime_env = {"env_vars": worker_env(runtime, self.env)}
        self.warm = warm
        self.retries = retries
        self.echo = echo
        self.root = Path(repo.root_dir)
        self.cluster_gpus = ray.cluster_resources().get("GPU", 0)
        self.task = ray.remote(run_stage_command)
        self.outcomes: dict[Any, Outcome] = {}
        self.lock_writer = LockWriter(repo, already_written=0)
        self.slots = slots  # stages at once (the estimate divides by it)
        self.durations = durations or {}  # seconds each stage took when it last ran (the estimate)
        self.epochs = epochs  # echo each running stage's epochs

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
            except RunCacheNotFoundError:
                stage.save_deps()
            else:
                _record(stage, run_cache=False)
                self.lock_writer.add(stage)
                return Outcome(stage.addressing, "restored", detail="run cache")
        log = _log_path(self.root, stage.addressing)
        outs = [out.fs_path for out in stage.outs if not out.persist]
        cmd = stage.cmd if isinstance(stage.cmd, str) else " && ".join(stage.cmd)
        log.unlink(missing_ok=True)  # the task writes it when it starts
        ref = self.task.options(**stage_resources(stage, self.runtime, self.cluster_gpus),
                                max_retries=self.retries, retry_exceptions=False, name=stage.addressing,
                                runtime_env=self.runtime_env).remote(
            stage.addressing, cmd, stage.wdir, outs, {**self.env, "DVC_ROOT": str(self.root),
                                                      "DVC_STAGE": stage.addressing}, str(log), self.warm)
        return Running(stage, ref, time.time(), log)

    def _finish(self, running: Running, result: dict) -> Outcome:
        """Record a finished command: its outputs saved and cached and its ``dvc.lock`` entry written, as
        ``dvc repro`` does after running it."""
        stage = running.stage
        warnings = tracking_warnings(running.log)
        if result["returncode"] != 0:
            return Outcome(stage.addressing, "failed", result["host"], result["seconds"],
                           f"exit {result['returncode']}; log {running.log}", tracking_warnings=warnings)
        with self.repo.lock:
            no_cache_outs = any(not out.use_cache for out in stage.outs if not (out.is_metric or out.is_plot))
            _record(stage, run_cache=not no_cache_outs)
        self.lock_writer.add(stage)
        return Outcome(stage.addressing, "ran", result["host"], result["seconds"], tracking_warnings=warnings)

    def _echo_epochs(self, item: Running) -> None:
        """One short line per epoch a running stage finished since the last look at its log."""
        try:
            with open(item.log, errors="replace") as f:
                f.seek(item.read)
                text = f.read()
        except OSError:
            return
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1  # a row still being written waits for the next look
        item.read += len(text[:cut].encode())
        for line in epoch_lines(text[:cut]):
            self.echo(f"epoch      {item.stage.addressing}: {line}")

    def estimate(self, waiting: list, running: dict) -> str:
        """What is left by the last durations of the stages not finished (divided by the slots), or ''."""
        now = time.time()
        known = [self.durations.get(s.addressing) for s in waiting] + [
            max(0.0, self.durations[r.stage.addressing] - (now - (r.started or now))) if r.stage.addressing in
            self.durations else None for r in running.values()]
        if not any(k is not None for k in known):
            return ""
        left = sum(k or 0.0 for k in known) / max(1, self.slots)
        unknown = sum(k is None for k in known)
        return f", ~{left / 60:.1f} min left by the last durations" + (f" ({unknown} unknown)" if unknown else "")

    def run(self, the_plan: Plan) -> list[Outcome]:
        """Run ``the_plan``; every stage recorded is in ``dvc.lock`` when this returns or raises."""
        try:
            return self._run(the_plan)
        finally:
            self.lock_writer.write()

    def _run(self, the_plan: Plan) -> list[Outcome]:
        ray = self.ray
        waiting = list(the_plan.order)
        running: dict[Any, Running] = {}
        total = len(waiting)
        last_beat = time.time()
        try:
            while waiting or running:
                for stage in list(waiting):
                    needs = the_plan.needs[stage]
                    if any(n not in self.outcomes for n in needs):  # an upstream stage is waiting or running
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
                    self.echo(f"queued     {stage.addressing}")
                if not running:
                    continue
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for item in running.values():
                    if item.started is None and item.log.exists():
                        item.started = time.time()
                        self.echo(f"running    {item.stage.addressing}")
                    if item.started is not None and self.epochs:
                        self._echo_epochs(item)
                if self.lock_writer.due(idle=not done):
                    self.lock_writer.write()
                for ref in done:
                    item = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - retries exhausted, node lost: the stage failed
                        result = {"returncode": -1, "host": "-", "seconds": time.time() - item.submitted,
                                  "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    if self.epochs and item.started is not None:
                        self._echo_epochs(item)
                    outcome = self._finish(item, result)
                    if "error" in result:
                        outcome.detail = result["error"]
                    outcome.ended_at = time.time()
                    self.outcomes[item.stage] = outcome
                    finished = sum(o.status in ("ran", "failed") for o in self.outcomes.values())
                    started = sum(r.started is not None for r in running.values())
                    self.echo(f"{outcome.status:<10} {outcome.stage} on {outcome.host} in {outcome.seconds:.1f} s"
                              f" [{finished} finished, {started} running, {len(running) - started} queued, "
                              f"{len(waiting)} waiting of {total}{self.estimate(waiting, running)}]")
                    for line in outcome.tracking_warnings:  # an untracked run is said on the console, not only in its log
                        self.echo(f"  UNTRACKED {outcome.stage}: {line}")
                    if outcome.status == "failed":
                        self.echo("\n".join([f"  {outcome.detail}", *("  | " + line for line in
                                                                       _tail(item.log).splitlines())]))
                if time.time() - last_beat > 60 and running:
                    last_beat = time.time()
                    for item in running.values():
                        if item.started is not None:
                            self.echo(f"running    {item.stage.addressing}: {time.time() - item.started:.0f} s")
        except KeyboardInterrupt:
            for ref, item in running.items():
                ray.cancel(ref, force=True)
                self.outcomes[item.stage] = Outcome(item.stage.addressing, "cancelled",
                                                    seconds=time.time() - (item.started or item.submitted))
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
    """``summary.json`` of this launch, and ``durations.json``: each stage's seconds the last time it ran (the
    next launch's estimate)."""
    path = root / LOG_DIR / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    untracked = sorted({o.stage for o in outcomes if o.tracking_warnings})
    io.write_json(path, {"wall_seconds": wall, "jobs": jobs, "address": address, "untracked_stages": untracked,
                       "stages": [o.__dict__ for o in outcomes]})
    durations = last_durations(root)
    durations.update({o.stage: round(o.seconds, 1) for o in outcomes if o.status == "ran"})
    io.write_json(root / LOG_DIR / "durations.json", durations)
    return path


#: The local Ray instance's processes (pid, start time) as last seen by its driver: what a watchdog, or the next
#: launch, kills when the driver died without shutting Ray down.
RAY_PROCESSES = LOG_DIR / "ray-processes.json"


def record_ray_processes(root: Path) -> None:
    """Write every process below this driver (Ray's GCS, raylet, agents, workers) to :data:`RAY_PROCESSES`."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
        io.write_json(root / RAY_PROCESSES, {"driver": os.getpid(),
                                           "processes": [[c.pid, c.create_time()] for c in children]})
    except (psutil.Error, OSError):
        pass


def reap_ray_processes(root: Path) -> int:
    """Kill what a driver that died left of its local Ray instance (:data:`RAY_PROCESSES`; a process is killed only
    when its pid and start time both match: a pid reused since is left alone). SIGKILL: Ray's dashboard and
    runtime-env agents ignore SIGTERM once their raylet is gone. Returns how many were killed."""
    import psutil

    path = root / RAY_PROCESSES
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if psutil.pid_exists(record.get("driver", -1)) and record["driver"] != os.getpid() and \
            _is_launch_driver(record["driver"]):
        return 0  # its driver is alive: a launch is running here
    killed = []
    for pid, started in record.get("processes", []):
        if pid == os.getpid():  # the watchdog is the driver's child too
            continue
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - started) < 0.01:
                process.kill()
                killed.append(process)
        except psutil.Error:
            pass
    psutil.wait_procs(killed, timeout=10)
    path.unlink(missing_ok=True)
    return len(killed)


def _is_launch_driver(pid: int) -> bool:
    import psutil

    try:
        return any("noisydml" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def start_watchdog(root: Path):
    """A process that outlives this driver by a moment: when the driver dies (however: SIGKILL included, the pipe
    it holds closes), it kills what the driver left of its local Ray instance (:func:`reap_ray_processes`)."""
    read, write = os.pipe()
    code = ("import os, sys, time; from pathlib import Path;"
            "from noisydml.tools.launch import reap_ray_processes;"
            f"os.read({read}, 1); time.sleep(0.5); reap_ray_processes(Path(sys.argv[1]))")
    watchdog = subprocess.Popen([sys.executable, "-c", code, str(root)], pass_fds=(read,), start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(read)
    return watchdog, write


def init_ray(local_cpus: int, address: str | None):
    """Join the cluster at ``address``, or start a local Ray instance offering ``local_cpus`` CPUs."""
    try:
        import ray
    except ImportError as e:
        raise LaunchError("the launcher needs Ray: pip install 'ray>=2.40'") from e
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="WARNING")
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local": a new instance even where `ray start` runs one (ray.init() alone would join that)
        ray.init(address="local", num_cpus=local_cpus, object_store_memory=128 * 1024**2, **kwargs)
    return ray


def build_parser() -> argparse.ArgumentParser:
    """``noisydml launch``'s options (the tests parse every documented launch command with it)."""
    parser = argparse.ArgumentParser(prog="noisydml launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="stages (as `dvc repro` takes them) and what they need; "
                                                   "default: the whole pipeline")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="local Ray instance: runs at once (default: this machine's cores / runtime.threads, "
                             "at least 1); not with --address")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                        help="a Ray cluster started with `ray start` (HEAD_IP:6379, or auto; default: RAY_ADDRESS "
                             "if set, else a new Ray instance on this machine)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI for every run (e.g. http://HEAD:5000 of an "
                                               "`mlflow server`; default: MLFLOW_TRACKING_URI, else the "
                                               "repository's mlflow.db)")
    parser.add_argument("--retries", type=int, default=3,
                        help="times Ray retries a task whose worker died (default 3; a failing command is not retried)")
    parser.add_argument("--fresh-processes", action="store_true",
                        help="start every stage as a new process (its command line exactly); default: this "
                             "pipeline's `python stages/<x>.py` stages run inside Ray's worker processes, which "
                             "keep their imports from one stage to the next (same outputs; README)")
    parser.add_argument("-S", "--set-param", action="append", default=[], metavar="OVERRIDE",
                        help="set a value in params.yaml first, as `dvc exp run -S` does (DVC's own code: Hydra's grammar, "
                             "`+key=` for a new key, `~key` to remove one); all of them validated before anything "
                             "is written (a refused value changes nothing; with --dry nothing is written), then "
                             "written in place (comments and anchors kept); the file stays changed, as in the "
                             "workspace after `dvc exp run -S`; repeatable")
    parser.add_argument("--dry", action="store_true",
                        help="say which stages would run (stale now, or downstream of one) and the estimate from the "
                             "last launch's durations; run nothing")
    parser.add_argument("--quiet-epochs", action="store_true",
                        help="no line per finished epoch of each running training stage (they stay in its log)")
    parser.add_argument("--params", default="params.yaml",
                        help="the params file -S edits and the launch reads (default: params.yaml; DVC's stages "
                             "read params.yaml)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs is not None and args.address:
        parser.error("-j/--jobs sizes a local Ray instance; a cluster's size is its `ray start` options")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"-j/--jobs: {args.jobs}; allowed: 1 or more")

    import logging

    from dvc.repo import Repo

    from noisydml.config import read_params_file
    from noisydml.numerics import usable_cores
    from noisydml.runtime import runtime_settings

    edit = apply_overrides(args) if args.set_param else None
    runtime = runtime_settings(edit.data.get("runtime") if edit and args.dry else
                               read_params_file(args.params).get("runtime"))
    cores = usable_cores()
    jobs = args.jobs if args.jobs is not None else max(1, cores // max(1, runtime["threads"]))
    local_cpus = jobs * max(1, runtime["threads"]) * runtime["processes"]  # -j runs of the task size (stage_resources)
    started = time.time()
    logging.getLogger("dvc").setLevel(logging.WARNING)  # DVC's "Updating lock file" lines between ours
    repo = Repo(".")
    root = Path(repo.root_dir)
    the_plan = plan(repo, args.targets)
    durations = last_durations(root)
    if args.dry:
        with repo.lock:
            return dry_run(the_plan, durations, jobs if not args.address else None,
                           edit if edit is not None and edit.changed else None, root)
    outcomes, interrupted = run_on_ray(args, repo, root, runtime, the_plan, durations, jobs, local_cpus, cores)
    return finish(args, root, outcomes, time.time() - started, jobs, interrupted)


def apply_overrides(args) -> Any:
    """``-S``: a transaction: DVC's -S on a copy, the result validated whole (every problem at once), and only
    then written, as a minimal edit of the file (comments and anchors kept); ``--dry`` writes nothing. Returns the
    edit (:func:`noisydml.tools.overrides.apply`)."""
    from noisydml.tools.overrides import apply

    edit = apply(args.params, args.set_param)
    from noisydml.tools.check import report_name_warnings, validate_all  # after DVC took -S (torch's import: seconds)

    checked = validate_all(edit.data, files=Path(args.params).resolve().parent)
    for warning in report_name_warnings(checked):
        print(f"launch: warning: {warning}", file=sys.stderr)
    if not args.dry:
        edit.write()
        print(f"launch: {args.params}: " + (f"set {', '.join(edit.changed_keys()) or 'nothing (same values)'}"
              if edit.careful else "rewritten in DVC's own form (as `dvc exp run -S` writes it: comments and "
              "anchors not kept), the values being ones our in-place edit cannot place"), flush=True)
    return edit


def run_on_ray(args, repo, root: Path, runtime: dict, the_plan: Plan, durations: dict, jobs: int, local_cpus: int,
               cores: int) -> tuple[list, bool]:
    """Start Ray (a local instance, watched, or ``--address``'s cluster), run the plan's stale stages on it, shut
    it down; returns the outcomes per stage and whether Ctrl-C / SIGTERM interrupted it."""
    if not args.address and (reaped := reap_ray_processes(root)):
        print(f"launch: killed {reaped} process(es) left by a launcher that died before shutting Ray down", flush=True)
    create_store(args.tracking_uri)
    if not args.address:
        watchdog, watchdog_pipe = start_watchdog(root)
    ray = init_ray(local_cpus, args.address)
    if not args.address:
        record_ray_processes(root)
    # Ctrl-C, and SIGTERM (Slurm's end of a job's time, `kill`): cancel the running stages, record the finished
    # ones. Set after ray.init (it replaces the SIGTERM handler) and explicitly: a process started with SIGINT
    # ignored (a batch system, a test runner's worker) would otherwise never see Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    where = args.address or f"this machine, {jobs} at once"
    print(f"launch: {len(the_plan.order)} stages in the graph; Ray on {where}", flush=True)

    def echo(line: str) -> None:
        print(line, flush=True)
        if not args.address and line.startswith("running "):  # Ray starts agents and workers as stages start
            record_ray_processes(root)

    launcher = Launcher(repo, runtime, tracking_uri=args.tracking_uri, retries=args.retries,
                        warm=not args.fresh_processes, echo=echo, slots=jobs if not args.address else 1,
                        durations=durations, epochs=not args.quiet_epochs,
                        # a cluster's nodes may run several tasks on shared cores; here: -j runs of their threads
                        shared_cores=bool(args.address) or local_cpus > cores)
    interrupted = False
    try:
        outcomes = launcher.run(the_plan)
    except KeyboardInterrupt:
        interrupted = True
        outcomes = [launcher.outcomes.get(s, Outcome(s.addressing, "not run")) for s in the_plan.order]
        print("\ninterrupted: finished stages are recorded in dvc.lock; the next launch (or `dvc repro`) runs "
              "the rest, training runs resume from their checkpoints", flush=True)
    finally:
        ray.shutdown()
        if not args.address:
            reap_ray_processes(root)  # what shutdown left (nothing, normally)
            os.close(watchdog_pipe)
            watchdog.wait(timeout=30)
    return outcomes, interrupted


def finish(args, root: Path, outcomes: list, wall: float, jobs: int, interrupted: bool) -> int:
    """The summary table and file, the warnings; the exit status (130 interrupted, 1 a stage failed)."""
    print(summary_table(outcomes))
    write_summary(root, outcomes, wall, None if args.address else jobs, args.address)
    untracked = [o.stage for o in outcomes if o.tracking_warnings]
    if untracked:
        print(f"launch: WARNING {len(untracked)} stage(s) could not track their run in MLflow (their outputs are "
              f"complete; their warnings are above and in their logs): {', '.join(untracked)}", file=sys.stderr)
    if interrupted:
        return 130
    failed = [o.stage for o in outcomes if o.status == "failed"]
    skipped = [o.stage for o in outcomes if o.status == "not run"]
    print(f"launch: {wall:.1f} s wall", flush=True)
    if failed:
        print(f"launch: FAILED {', '.join(failed)}; not run (they need a failed stage): "
              f"{', '.join(skipped) or 'none'}", file=sys.stderr)
        return 1
    return 0


def create_store(uri: str | None) -> None:
    """Create a new SQLite MLflow store before any stage starts (its schema once; the stages' own opening is also
    serialised, noisydml.tracking.open_store): nothing to do when it exists or is a server."""
    import logging

    from noisydml.tracking import sqlite_path, tracking_uri

    db = sqlite_path(uri or tracking_uri())
    if db is None or db.exists():
        return
    print(f"launch: creating the MLflow store {db}", flush=True)
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its "Creating initial MLflow database tables" lines
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        from noisydml.tracking import open_store

        open_store(str(uri or tracking_uri()))
    except Exception as e:  # noqa: BLE001 - the stages warn again, each, on the console
        print(f"launch: warning: could not create the MLflow store {db} ({type(e).__name__}: {str(e)[:200]})",
              flush=True)


def dry_run(the_plan: Plan, durations: dict, jobs: int | None, edit=None, root: Path | None = None) -> int:
    """``--dry``: the stages that would run (stale now, or needing one that would), the estimate; nothing runs.
    With ``edit`` (``-S``, not written): also the stages whose declared params it changes, and the stages it would
    add to the graph (DVC's parse of dvc.yaml under the edited params), which have never run."""
    from noisydml.tools.overrides import touches

    would: list = []
    changed = edit.changed_keys() if edit else []
    for stage in the_plan.order:  # upstream first
        if (any(n in would for n in the_plan.needs[stage]) or stage.changed()
                or any(touches(key, c) for key in _declared_params(stage) for c in changed)):
            would.append(stage)
    added: list[str] = []
    if edit is not None and root is not None:
        from noisydml.tools.overrides import stage_names_with

        edited = stage_names_with(root / "dvc.yaml", edit.text)
        added = sorted(edited - {s.addressing for s in the_plan.order})
        # stages the -S values take out of the graph (another dataset, fewer seeds) are not run by the launch
        gone = [s for s in would if s.addressing not in edited]
        would = [s for s in would if s.addressing in edited]
        if gone:
            print(f"not in the graph with the -S values: {len(gone)} stage(s) (e.g. {gone[0].addressing}); "
                  "the launch does not run them")
    known = [durations.get(s.addressing) for s in would]
    for stage, seconds in zip(would, known):
        print(f"would run  {stage.addressing}" + (f" (last {seconds:.0f} s)" if seconds is not None else
                                                  " (duration unknown: never measured)"))
    for name in added:
        print(f"would run  {name} (new with the -S values; duration unknown)")
    total = len(would) + len(added)
    unknown = sum(k is None for k in known) + len(added)
    measured = [k for k in known if k is not None]
    if not total:
        estimate = "nothing to do"
    elif not measured:
        estimate = f"duration unknown: none of the {total} stage(s) has been measured"
    else:
        left = sum(measured) / max(1, jobs or 1)
        estimate = (f"~{left / 60:.1f} min at {jobs or 1} at once by the last durations of {len(measured)} stage(s)"
                    + (f", plus {unknown} never measured (unknown)" if unknown else ""))
    print(f"launch --dry: {total} of {len(the_plan.order) + len(added)} stages would run (a run-cache hit is restored "
          f"instead); {estimate}" + (f"; params.yaml not changed (-S {' -S '.join(edit.overrides)} was checked, "
                                     "not written)" if edit else ""))
    return 0


def _declared_params(stage) -> list[str]:
    from dvc.dependency.param import ParamsDependency

    return [key for dep in stage.deps if isinstance(dep, ParamsDependency) for key in (dep.params or [])]


def cli(argv: list[str] | None = None) -> int:
    """``main`` with known errors (bad params, no Ray, DVC's refusals) as one line and exit status 2."""
    from dvc.exceptions import DvcException

    from noisydml.schema import ParamsError

    try:
        return main(argv)
    except (ParamsError, LaunchError, DvcException) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
