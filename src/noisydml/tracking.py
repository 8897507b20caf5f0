"""MLflow tracking: one run per (dataset, noise, method, seed).

The tracking URI defaults to an absolute ``sqlite:///<repo>/mlflow.db``
(``MLFLOW_TRACKING_URI`` overrides it). ``dvc exp run --temp`` and queued
experiments execute in a copy under ``<repo>/.dvc/tmp/exps/``; the URI still
points at the main repository's database there, so those runs are kept.

A SQLite store keeps its artifacts beside it, in ``mlartifacts/`` of the database's folder (whatever the working
directory: a test's database keeps its artifacts with it, a temporary experiment's go to the main repository).
MLflow records artifact locations as absolute paths; a store that moved with its repository (a copy, a re-clone
that brought ``mlflow.db`` and ``mlartifacts/`` along) has its locations moved to where it now is the first
time it is opened (:func:`relocate_artifacts`). The schema of a new SQLite store is created by one process at a
time (:func:`open_store`: a file lock), so stages that start together never race to create it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

_EXPS_MARKER = os.sep + os.path.join(".dvc", "tmp", "exps") + os.sep


def repo_root(start: str | Path = ".") -> Path:
    """The main repository's root: the folder above a DVC temp-experiment copy, else the nearest
    folder holding ``dvc.yaml`` (or ``start`` itself)."""
    path = Path(start).resolve()
    text = str(path) + os.sep
    if _EXPS_MARKER in text:
        return Path(text.split(_EXPS_MARKER, 1)[0])
    for candidate in (path, *path.parents):
        if (candidate / "dvc.yaml").is_file():
            return candidate
    return path


def tracking_uri(start: str | Path = ".") -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root(start) / 'mlflow.db'}"


#: How every line a stage prints about a run it could not track begins (the launcher echoes and counts them).
TRACKING_WARNING = "warning: MLflow"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI, else None (a tracking server, another database)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(unquote(uri[len("sqlite:///"):].split("?", 1)[0])).absolute()


def git_commit(cwd: str | Path = ".") -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def mlflow_experiment(params: dict, dataset: str) -> str:
    """One MLflow experiment per dataset: ``<tracking.experiment>-<dataset>`` (runs of one dataset compare)."""
    return f"{params['tracking']['experiment']}-{dataset}"


def mlflow_run_name(run: str, noise: str, seed: int) -> str:
    """What MLflow's run list shows: the run (method or chain name), its noise setting and seed."""
    return f"{run} · {noise} · seed {seed}"


def standard_tags(root: str | Path = ".") -> dict[str, str]:
    """MLflow's own tags for the code (``mlflow.source.*``) and, under ``dvc exp run``, the DVC experiment's name
    and baseline commit (DVC sets ``DVC_EXP_NAME`` / ``DVC_EXP_BASELINE_REV`` for the commands it runs)."""
    tags = {"mlflow.source.git.commit": git_commit(root)}
    for variable, tag in (("DVC_EXP_NAME", "dvc.experiment"), ("DVC_EXP_BASELINE_REV", "dvc.baseline_rev")):
        if os.environ.get(variable):
            tags[tag] = os.environ[variable]
    return tags


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _retry_when_locked(fn, attempts: int = 6, delay: float = 0.5):
    """Run ``fn``; retry while SQLite says the database is locked (two writers at one moment; the schema's
    creation is serialised apart, :func:`open_store`)."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # sqlalchemy's OperationalError arrives wrapped in MlflowException
            if "database is locked" not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(delay * (2**attempt))


def artifact_root(uri: str | None = None) -> str | None:
    """Where new experiments of the store at ``uri`` (default: :func:`tracking_uri`) keep artifacts: a SQLite
    store's ``mlartifacts/`` beside its database (absolute, so runs from ``dvc exp run --temp`` copies do not
    leave their artifacts in a deleted folder, and a test's store keeps them in its own folder); None for a
    tracking server (its own ``--artifacts-destination``)."""
    db = sqlite_path(uri or tracking_uri())
    return None if db is None else (db.parent / "mlartifacts").as_uri()


@contextlib.contextmanager
def _store_lock(db: Path):
    """An exclusive lock on ``<db>.lock`` (fcntl; released when the process dies, however it dies)."""
    import fcntl

    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def relocate_artifacts(db: Path) -> int:
    """Point a moved SQLite store's artifact locations at its own ``mlartifacts/``; the number of rows changed.

    MLflow stores ``file://<folder>/mlartifacts`` per experiment and ``.../<run id>/artifacts`` per run, absolute;
    when ``<folder>`` is not the database's folder (the store was copied or re-cloned with its artifacts) and the
    artifacts are where they now belong (the experiment's runs' folders under this ``mlartifacts/``), the prefix is
    rewritten (MLflow has no API to move an experiment's artifacts). Locations of other kinds (a server's, S3)
    are left alone."""
    if not db.is_file():
        return 0
    own = (db.parent / "mlartifacts").as_uri()
    changed = 0
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as connection, connection:
        try:
            experiments = connection.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:  # no schema yet
            return 0
        for experiment, location in experiments:
            if not location or not location.startswith("file://") or not location.endswith("/mlartifacts") \
                    or location == own:
                continue
            runs = connection.execute("SELECT run_uuid FROM runs WHERE experiment_id = ?", (experiment,)).fetchall()
            if runs and not any((db.parent / "mlartifacts" / run).is_dir() for (run,) in runs):
                continue  # the artifacts did not come along: leave the old location (it may still exist)
            connection.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                               (own, experiment))
            changed += 1 + connection.execute(
                "UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE experiment_id = ? "
                "AND artifact_uri LIKE ? || '/%'", (own, len(location) + 1, experiment, location)).rowcount
    return changed


def open_store(uri: str):
    """An MLflow client of ``uri`` whose store exists: a new SQLite store's schema created under a file lock
    (two stages starting together raced to create it, and one run went untracked: "table ... already exists"),
    a moved one's artifact locations moved (:func:`relocate_artifacts`)."""
    import mlflow

    db = sqlite_path(uri)
    if db is None:
        return mlflow.MlflowClient(uri)
    with _store_lock(db):
        client = mlflow.MlflowClient(uri)
        client.search_experiments(max_results=1)  # opens the store: creates or upgrades its schema
        relocate_artifacts(db)
    return client


def experiment_id(client, name: str, artifacts: str | None = None) -> str:
    """The id of experiment ``name``, created if missing with its artifacts in ``artifacts`` (default: the
    client's store's, :func:`artifact_root`)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifacts or artifact_root(client.tracking_uri))
    except MlflowException as e:  # created meanwhile by a parallel run
        if "already exists" not in str(e):
            raise
        return client.get_experiment_by_name(name).experiment_id


def _warning(what: str, error: Exception) -> str:
    return (f"{TRACKING_WARNING} {what} failed ({type(error).__name__}: {str(error)[:300]}); the stage goes on "
            "without tracking (DVC outputs never depend on MLflow)")


class MlflowTracker:
    """One MLflow run per training run, written by the tracking process (:class:`TrackingProcess`).

    ``start()`` asks the tracking process to open the run (or re-open it on resume) and log its params, and returns
    at once; ``run_id`` waits for its answer (the trainer asks at its first checkpoint, after an epoch of
    training: MLflow's import and database opening, 2-3 s of CPU, ran meanwhile, on another core when there is
    one); ``log_metrics`` and ``log_artifact`` hand their record over and return; ``end()`` waits until every
    record is written and the run is closed.

    Best effort: a missing, locked or foreign ``mlflow.db`` (runs pulled from a remote, another machine), MLflow
    not installed, or a tracking process that died, prints a warning and the run goes on untracked; no DVC output
    depends on MLflow.
    """

    def __init__(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str],
                 root: str | Path = "."):
        self.experiment = experiment
        self.run_name = run_name
        self.root = root  # the repository the run is written into: its store (tracking_uri(root)) tracks it
        # as text here: MLflow keeps a param as its str(); JSON on the way would turn a tuple into a list
        self.params = {key: str(value) for key, value in flatten(params).items()}
        self.tags = tags
        self._process: TrackingProcess | None = None
        self._run_id: str | None = None
        self._opening = False  # start() sent, its answer not read yet
        self._ticket = next(_tickets)  # in this run's requests and their answers: an answer is read by its run only

    def start(self, run_id: str | None = None) -> None:
        self._process = tracking_process()
        self._opening = self._send({"op": "start", "ticket": self._ticket, "uri": tracking_uri(self.root),
                                    "experiment": self.experiment, "run_name": self.run_name, "params": self.params,
                                    "tags": self.tags, "resume_id": run_id})

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (waits for the tracking process to have opened it); None when untracked."""
        if self._opening:
            self._opening = False
            self._run_id = self._answer().get("run_id")
            if self._run_id is None:
                self._process = None
        return self._run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._send({"op": "metrics", "metrics": {k: float(v) for k, v in metrics.items()}, "step": step,
                    "stamp": int(time.time() * 1000)})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._send({"op": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def end(self, status: str = "FINISHED") -> None:
        """Wait until every record is written, then close the run with ``status``."""
        if self.run_id is not None and self._send({"op": "end", "ticket": self._ticket, "status": status}):
            self._answer()
        self._process = None

    def _send(self, message: dict) -> bool:
        if self._process is None:
            return False
        if not self._process.send(message):
            self._process = None
            return False
        return True

    def _answer(self) -> dict:
        """The tracking process's answer to this run's last request; an answer to another run's (one left open
        before its end, by a caller that did not close it) is passed over, its messages printed."""
        while True:
            answer = self._process.receive() if self._process is not None else {}
            for line in answer.get("messages", ()):
                print(line)
            if answer.get("ticket") in (None, self._ticket):  # None: the process is gone
                return answer


_tickets = itertools.count()

#: How the tracking process starts (tests start it under a wrapper).
TRACKING_COMMAND = (sys.executable, "-m", "noisydml.tracking")


class TrackingProcess:
    """The process that holds MLflow for a training process: ``python -m noisydml.tracking``.

    Why a process: MLflow's import and its SQLAlchemy store cost 2-3 s of CPU, and a thread cannot take them off
    the training's path: MLflow writes the process environment while it loads (its telemetry session id;
    OPENBLAS_MAIN_FREE), and glibc's setenv racing the training thread's getenv crashed a train stage (SIGSEGV in
    libc). One process per training process, kept for its life (a warm launcher worker opens the database once);
    messages are JSON lines on its stdin, answers (to ``start`` and ``end``) JSON lines on its stdout, and what it
    has to say comes back in those answers for the stage to print (MLflow's own log lines go to the stderr of the
    stage that started it: in a warm worker, the first stage's log). Its own session: a Ctrl-C meant for the stage
    does not stop it mid-write (the stage closes the run as KILLED); it exits when the stage's end of the pipe
    closes, however the stage ended.
    """

    def __init__(self):
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true")}
        self.process = subprocess.Popen(TRACKING_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: dict) -> bool:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            return True
        except (BrokenPipeError, OSError, ValueError) as e:
            print(f"{TRACKING_WARNING}'s tracking process is gone ({type(e).__name__}, exit code "
                  f"{self.process.poll()}); the stage goes on without tracking")
            return False

    def receive(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            return {"messages": [f"{TRACKING_WARNING}'s tracking process exited (code {self.process.wait()}) before "
                                 "answering; the stage goes on without tracking"]}
        return json.loads(line)


_tracking_process: TrackingProcess | None = None


def tracking_process() -> TrackingProcess:
    """This process's tracking process, started on first use (again if it died)."""
    global _tracking_process
    if _tracking_process is None or not _tracking_process.alive():
        _tracking_process = TrackingProcess()
    return _tracking_process


@functools.cache
def client_for(uri: str):
    """One MLflow client per tracking URI and process (its store opens the database once, :func:`open_store`)."""
    return open_store(uri)


def _open_run(client, message: dict, say) -> str:
    """Open (or, given ``resume_id``, re-open) the run ``message`` describes and log its params; its id."""
    from mlflow.entities import Param

    exp = _retry_when_locked(lambda: experiment_id(client, message["experiment"]))
    resume_id = message["resume_id"]
    if resume_id is not None:
        try:
            client.get_run(resume_id)
            client.update_run(resume_id, status="RUNNING")
            return resume_id
        except Exception as e:  # noqa: BLE001 - a resumed run whose MLflow run is gone: a new one
            say(_warning(f"re-opening run {resume_id}", e))
    run_id = _retry_when_locked(lambda: client.create_run(exp, run_name=message["run_name"],
                                                          tags=message["tags"])).info.run_id
    # MLflow caps a param value at 6000 characters and a batch at 100 params; ours are short.
    params = [Param(k, v) for k, v in message["params"].items()]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i : i + 100])
    return run_id


def serve(lines, answer) -> None:
    """The tracking process's loop: one message a line from ``lines``; ``answer(dict)`` replies to start and end.

    A failure stops tracking the current run (a warning in the next answer); the next ``start`` tries again.
    """
    client, run_id, said = None, None, []
    for line in lines:
        message = json.loads(line)
        op = message["op"]
        try:
            if op == "start":
                run_id = None
                client = client_for(message["uri"])
                run_id = _open_run(client, message, said.append)
            elif run_id is None:
                pass  # the run is untracked: its start failed, and said why
            elif op == "metrics":
                from mlflow.entities import Metric

                client.log_batch(run_id, metrics=[Metric(k, v, message["stamp"], message["step"])
                                                  for k, v in message["metrics"].items()])
            elif op == "artifact":
                client.log_artifact(run_id, message["path"], message["artifact_path"])
            elif op == "end":
                client.set_terminated(run_id, message["status"])
        except ImportError as e:  # a machine without MLflow (a GPU machine given only the training path's wheels)
            said.append(f"{TRACKING_WARNING} is not installed here ({e}); this run is not tracked (pip install "
                        "mlflow); its DVC outputs are the same")
            run_id = None
        except Exception as e:  # noqa: BLE001 - tracking must never stop a stage
            said.append(_warning("start" if op == "start" else "end_run" if op == "end" else f"log_{op}", e))
            run_id = None
        if op in ("start", "end"):
            reply = {"ticket": message.get("ticket"), "messages": said}
            answer({**reply, "run_id": run_id} if op == "start" else reply)
            said = []
            if op == "end":
                run_id = None


def log_to_run(run_id: str | None, metrics: dict[str, float], artifacts: list[Path] = (),
               root: str | Path = ".") -> bool:
    """Add final metrics and artifacts to a finished run (the evaluate stage) in the store of the repository at
    ``root``. Best effort: False if not logged."""
    if not run_id:
        print("note: no MLflow run recorded for this training run (trained elsewhere or untracked); "
              "final metrics are not logged to MLflow")
        return False
    # MLflow's telemetry off unless the user set it, as in the tracking process (MLflow reads it as it loads;
    # the evaluate stage has no thread of ours that reads the environment)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        import mlflow

        uri = tracking_uri(root)
        open_store(uri)
        mlflow.set_tracking_uri(uri)
        with mlflow.start_run(run_id=run_id):
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
            for path in artifacts:
                mlflow.log_artifact(str(path))
        return True
    except Exception as e:  # noqa: BLE001 - a missing or foreign mlflow.db must not fail the stage
        print(_warning(f"logging final metrics to run {run_id}", e))
        return False


def main() -> None:
    """``python -m noisydml.tracking``: the tracking process (:class:`TrackingProcess`)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stage's Ctrl-C is the stage's: it closes the run itself
    out = sys.stdout

    def answer(reply: dict) -> None:
        out.write(json.dumps(reply) + "\n")
        out.flush()

    sys.stdout = sys.stderr  # whatever MLflow prints goes to the stage's log, not into the answers
    serve(sys.stdin, answer)


if __name__ == "__main__":
    main()
