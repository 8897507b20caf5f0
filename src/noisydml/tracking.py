"""MLflow tracking: one run per (dataset, noise, method, seed).

The tracking URI defaults to an absolute ``sqlite:///<repo>/mlflow.db``
(``MLFLOW_TRACKING_URI`` overrides it). ``dvc exp run --temp`` and queued
experiments execute in a copy under ``<repo>/.dvc/tmp/exps/``; the URI still
points at the main repository's database there, so those runs are kept.
"""

from __future__ import annotations

import functools
import os
import subprocess
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
    """One MLflow run per training run, its metrics logged with MLflow's asynchronous logging.

    ``start()`` opens the run (or re-opens it on resume) and logs its params; ``log_metrics`` hands each epoch's
    metrics to MLflow's own logging queue (``log_batch(..., synchronous=False)``) and returns at once, so the
    database writes overlap training; ``end()`` waits for every pending batch and closes the run. The client, and
    so its database connection, is kept per tracking URI for the life of the process: a warm launcher worker
    opens the database once, not once per run.

    Best effort: a missing, locked or foreign ``mlflow.db`` (runs pulled from a remote, another machine)
    prints a warning once and the run goes on untracked; no DVC output depends on MLflow.
    """

    def __init__(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]):
        self.experiment = experiment
        self.run_name = run_name
        self.params = flatten(params)
        self.tags = tags
        self.run_id: str | None = None
        self._client = None
        self._pending: list = []  # MLflow's RunOperations of batches not yet known to be written

    def start(self, run_id: str | None = None) -> None:
        # Nothing may write the process environment from another thread: glibc's setenv racing the training
        # thread's getenv crashed a train stage (SIGSEGV in libc). MLflow writes it while it loads (its telemetry
        # session id; imports such as OPENBLAS_MAIN_FREE) and in set_tracking_uri: so it is loaded here, in the
        # main thread, its telemetry (a background thread that writes the environment, and network calls) is off
        # unless the user turns it on, and the client is given the URI instead of set_tracking_uri.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            self._client = client_for(tracking_uri())
            self.run_id = self._open(run_id)
        except ImportError as e:  # a machine without MLflow (a GPU machine given only the training path's wheels)
            print(f"note: MLflow is not installed here ({e}); this run is not tracked (pip install mlflow); "
                  "its DVC outputs are the same")
            self._client = None
        except Exception as e:  # noqa: BLE001 - tracking must never stop a stage
            _warn("start", e)
            self._client = None

    def _open(self, resume_id: str | None) -> str:
        from mlflow.entities import Param

        client = self._client
        exp = _retry_when_locked(lambda: experiment_id(client, self.experiment))
        if resume_id is not None:
            try:
                client.get_run(resume_id)
                client.update_run(resume_id, status="RUNNING")
                return resume_id
            except Exception as e:  # noqa: BLE001 - a resumed run whose MLflow run is gone: a new one
                _warn(f"re-opening run {resume_id}", e)
        run_id = _retry_when_locked(lambda: client.create_run(exp, run_name=self.run_name, tags=self.tags)).info.run_id
        # MLflow caps a param value at 6000 characters and a batch at 100 params; ours are short.
        params = [Param(k, str(v)) for k, v in self.params.items()]
        for i in range(0, len(params), 100):
            self._pending.append(client.log_batch(run_id, params=params[i : i + 100], synchronous=False))
        return run_id

    def _call(self, what: str, call) -> None:
        if self._client is None:
            return
        try:
            call()
        except Exception as e:  # noqa: BLE001
            _warn(what, e)
            self._client = None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from time import time as now

        def log():
            from mlflow.entities import Metric

            stamp = int(now() * 1000)
            batch = [Metric(k, float(v), stamp, step) for k, v in metrics.items()]
            self._pending.append(self._client.log_batch(self.run_id, metrics=batch, synchronous=False))

        self._call("log_metrics", log)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._call("log_artifact", lambda: self._client.log_artifact(self.run_id, str(path), artifact_path))

    def end(self, status: str = "FINISHED") -> None:
        """Wait for every pending batch, then close the run with ``status``."""
        def close():
            pending, self._pending = self._pending, []
            for operation in pending:
                operation.wait()  # raises what the logging thread met
            self._client.set_terminated(self.run_id, status)

        self._call("end_run", close)
        self._client = None


@functools.cache
def client_for(uri: str):
    """One MLflow client per tracking URI and process (its store opens the database once)."""
    import mlflow

    return mlflow.MlflowClient(uri)


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
