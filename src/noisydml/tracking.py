"""MLflow tracking: one run per (dataset, noise, method, seed).

The tracking URI defaults to an absolute ``sqlite:///<repo>/mlflow.db``
(``MLFLOW_TRACKING_URI`` overrides it). ``dvc exp run --temp`` and queued
experiments execute in a copy under ``<repo>/.dvc/tmp/exps/``; the URI still
points at the main repository's database there, so those runs are kept.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

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


def git_commit(cwd: str | Path = ".") -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
    """Run ``fn``; retry while SQLite says the database is locked.

    Parallel experiments (``dvc queue start -j N``) can race to create the schema of a new
    ``mlflow.db``; the loser sees "database is locked" and succeeds a moment later.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # sqlalchemy's OperationalError arrives wrapped in MlflowException
            if "database is locked" not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(delay * (2**attempt))


def artifact_root(start: str | Path = ".") -> str:
    """Where new experiments keep artifacts: the main repository's ``mlartifacts/`` (absolute, so
    runs from ``dvc exp run --temp`` copies do not leave their artifacts in a deleted folder)."""
    return (repo_root(start) / "mlartifacts").as_uri()


def experiment_id(client, name: str) -> str:
    """The id of experiment ``name``, created with artifacts under the main repository if missing."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root())
    except MlflowException as e:  # created meanwhile by a parallel run
        if "already exists" not in str(e):
            raise
        return client.get_experiment_by_name(name).experiment_id


def _warn(what: str, error: Exception) -> None:
    print(f"warning: MLflow {what} failed ({type(error).__name__}: {str(error)[:300]}); the stage goes on "
          "without tracking (DVC outputs never depend on MLflow)")


class MlflowTracker:
    """One MLflow run per training run, logged from a background thread.

    ``start()`` returns at once: a worker thread imports MLflow, opens the run (or re-opens it on resume) and
    then applies the logging calls in order while the epochs train, so MLflow's import and database work
    overlap training instead of adding to it. ``end()`` flushes and closes the run.

    Best effort: a missing, locked or foreign ``mlflow.db`` (runs pulled from a remote, another machine)
    prints a warning once and the run goes on untracked; no DVC output depends on MLflow.
    """

    def __init__(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]):
        self.experiment = experiment
        self.run_name = run_name
        self.params = flatten(params)
        self.tags = tags
        self._run_id: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._opened = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (waits for the worker to open the run; None when tracking failed)."""
        if self._thread is not None:
            self._opened.wait(timeout=300)
        return self._run_id

    def start(self, run_id: str | None = None) -> None:
        # The worker must never write the process environment: glibc's setenv racing the training thread's
        # getenv crashed a train stage (SIGSEGV in libc). MLflow writes it while it loads (its telemetry
        # session id; imports such as OPENBLAS_MAIN_FREE) and in set_tracking_uri. So MLflow is loaded here, in
        # the main thread, before training starts (0.7 s), its telemetry (a background thread that writes the
        # environment, and network calls) is off unless the user turns it on, and the worker hands the URI to
        # its client.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import mlflow  # noqa: F401

        self._thread = threading.Thread(target=self._work, args=(run_id,), name="mlflow-tracker", daemon=True)
        self._thread.start()

    def _open(self, client, resume_id: str | None) -> str:
        from mlflow.entities import Param

        exp = _retry_when_locked(lambda: experiment_id(client, self.experiment))
        if resume_id is not None:
            try:
                client.get_run(resume_id)
                client.update_run(resume_id, status="RUNNING")
                return resume_id
            except Exception as e:  # noqa: BLE001 - a resumed run whose MLflow run is gone: a new one
                _warn(f"re-opening run {resume_id}", e)
        run_id = client.create_run(exp, run_name=self.run_name, tags=self.tags).info.run_id
        # MLflow caps a param value at 6000 characters and a batch at 100 params; ours are short.
        params = [Param(k, str(v)) for k, v in self.params.items()]
        for i in range(0, len(params), 100):
            client.log_batch(run_id, params=params[i : i + 100])
        return run_id

    def _work(self, resume_id: str | None) -> None:
        client = None
        try:
            import mlflow

            client = mlflow.MlflowClient(tracking_uri())
            self._run_id = self._open(client, resume_id)
        except Exception as e:  # noqa: BLE001 - tracking must never stop a stage
            _warn("start", e)
            self._failed = True
        finally:
            self._opened.set()
        while True:
            item = self._queue.get()
            if item is None:
                return
            what, call = item
            if self._failed:
                continue
            try:
                call(client, self._run_id)
            except Exception as e:  # noqa: BLE001
                _warn(what, e)
                self._failed = True

    def _submit(self, what: str, call) -> None:
        if self._thread is not None:
            self._queue.put((what, call))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from time import time as now

        stamp = int(now() * 1000)

        def log(client, run_id):
            from mlflow.entities import Metric

            client.log_batch(run_id, metrics=[Metric(k, float(v), stamp, step) for k, v in metrics.items()])

        self._submit("log_metrics", log)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._submit("log_artifact", lambda client, run_id: client.log_artifact(run_id, str(path), artifact_path))

    def end(self, status: str = "FINISHED") -> None:
        """Flush every pending call, close the run with ``status`` and stop the worker."""
        if self._thread is None:
            return
        self._submit("end_run", lambda client, run_id: client.set_terminated(run_id, status))
        self._queue.put(None)
        self._thread.join(timeout=300)
        self._thread = None


def log_to_run(run_id: str | None, metrics: dict[str, float], artifacts: list[Path] = ()) -> bool:
    """Add final metrics and artifacts to a finished run (the evaluate stage). Best effort: False if not logged."""
    if not run_id:
        print("note: no MLflow run recorded for this training run (trained elsewhere or untracked); "
              "final metrics are not logged to MLflow")
        return False
    try:
        import mlflow

        mlflow.set_tracking_uri(tracking_uri())
        with mlflow.start_run(run_id=run_id):
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
            for path in artifacts:
                mlflow.log_artifact(str(path))
        return True
    except Exception as e:  # noqa: BLE001 - a missing or foreign mlflow.db must not fail the stage
        _warn(f"logging final metrics to run {run_id}", e)
        return False
