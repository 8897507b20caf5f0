"""MLflow tracking: one run per (dataset, noise, method, seed).

The tracking URI defaults to an absolute ``sqlite:///<repo>/mlflow.db``
(``MLFLOW_TRACKING_URI`` overrides it). ``dvc exp run --temp`` and queued
experiments execute in a copy under ``<repo>/.dvc/tmp/exps/``; the URI still
points at the main repository's database there, so those runs are kept.
"""

from __future__ import annotations

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


def ensure_experiment(name: str) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    if mlflow.get_experiment_by_name(name) is None:
        try:
            mlflow.create_experiment(name, artifact_location=artifact_root())
        except MlflowException as e:  # created meanwhile by a parallel run
            if "already exists" not in str(e):
                raise
    mlflow.set_experiment(name)


def _warn(what: str, error: Exception) -> None:
    print(f"warning: MLflow {what} failed ({type(error).__name__}: {str(error)[:300]}); the stage goes on "
          "without tracking (DVC outputs never depend on MLflow)")


class MlflowTracker:
    """Starts (or re-opens, on resume) one MLflow run and logs into it.

    Best effort: a missing, locked or foreign ``mlflow.db`` (runs pulled from a remote, another machine)
    prints a warning once and the run goes on untracked; no DVC output depends on MLflow.
    """

    def __init__(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]):
        self.experiment = experiment
        self.run_name = run_name
        self.params = flatten(params)
        self.tags = tags
        self.run_id: str | None = None
        self.mlflow = None
        try:
            import mlflow

            mlflow.set_tracking_uri(tracking_uri())
            self.mlflow = mlflow
        except Exception as e:  # noqa: BLE001 - tracking must never stop a stage
            _warn("set-up", e)

    def _call(self, what: str, fn):
        if self.mlflow is None:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            _warn(what, e)
            self.mlflow = None
            return None

    def start(self, run_id: str | None = None) -> str | None:
        def start():
            mlflow = self.mlflow
            _retry_when_locked(lambda: ensure_experiment(self.experiment))
            run = None
            if run_id is not None:
                try:
                    run = mlflow.start_run(run_id=run_id)
                except Exception as e:  # noqa: BLE001 - a resumed run whose MLflow run is gone: a new one
                    _warn(f"re-opening run {run_id}", e)
            if run is None:
                run = mlflow.start_run(run_name=self.run_name, tags=self.tags)
                # MLflow caps a param value at 6000 characters; ours are short scalars and lists.
                mlflow.log_params({k: str(v) for k, v in self.params.items()})
            return run.info.run_id

        self.run_id = self._call("start", start)
        return self.run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._call("log_metrics", lambda: self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._call("log_artifact", lambda: self.mlflow.log_artifact(str(path), artifact_path=artifact_path))

    def end(self, status: str = "FINISHED") -> None:
        self._call("end_run", lambda: self.mlflow.end_run(status=status))


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
