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


class MlflowTracker:
    """Starts (or re-opens, on resume) one MLflow run and logs into it."""

    def __init__(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri())
        self.experiment = experiment
        self.run_name = run_name
        self.params = flatten(params)
        self.tags = tags
        self.run_id: str | None = None

    def start(self, run_id: str | None = None) -> str:
        mlflow = self.mlflow
        _retry_when_locked(lambda: ensure_experiment(self.experiment))
        if run_id is not None:
            run = mlflow.start_run(run_id=run_id)
        else:
            run = mlflow.start_run(run_name=self.run_name, tags=self.tags)
            # MLflow caps a param value at 6000 characters; ours are short scalars and lists.
            mlflow.log_params({k: str(v) for k, v in self.params.items()})
        self.run_id = run.info.run_id
        return self.run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        self.mlflow.end_run(status=status)


def log_to_run(run_id: str, metrics: dict[str, float], artifacts: list[Path] = ()) -> None:
    """Add final metrics and artifacts to a finished run (the evaluate stage)."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    with mlflow.start_run(run_id=run_id):
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        for path in artifacts:
            mlflow.log_artifact(str(path))
