"""Nothing left running: a process tree the project starts ends with its parent, however the parent is stopped
(noisydml.processes). ``noisydml ui`` (MLflow's server: its CLI, web server and job consumers) and a stage
relaunched under torchrun, each stopped by its PID with SIGTERM and killed with SIGKILL: every process of the
tree is gone within 30 s. The launcher's Ray instance: tests/test_launch.py (SIGINT, SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from noisydml.engine import distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop_and_count(parent: subprocess.Popen, tree: list[psutil.Process], how: signal.Signals) -> list:
    parent.send_signal(how)
    parent.wait(timeout=60)
    _, alive = psutil.wait_procs(tree, timeout=30)
    return [(p.pid, p.name()) for p in alive]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_noisydml_ui_stopped_by_its_pid_leaves_no_process(how, tmp_path):
    from noisydml.tracking import open_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    open_store(uri)
    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"}
    noisydml = os.path.join(os.path.dirname(sys.executable), "noisydml")  # the console script, as a user runs it
    ui = subprocess.Popen([noisydml, "ui", "--port", str(port)], cwd=tmp_path, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _serving(port), 120, "the MLflow server")
        time.sleep(2)  # its job consumers start after the port opens
        tree = psutil.Process(ui.pid).children(recursive=True)
        assert len(tree) >= 3, tree  # the watchdog, MLflow's CLI, its server
        left = _stop_and_count(ui, tree, how)
        assert not left, left
        assert not _serving(port)
    finally:
        if ui.poll() is None:
            ui.kill()


_STAGE = """
import sys, time
from noisydml.engine import distributed
if not distributed.launched_by_torchrun():
    sys.exit(distributed.relaunch_under_torchrun(2, sys.argv))
d = distributed.init_from_environment('cpu')
open(f'{sys.argv[1]}.{d.rank}', 'w').write('up')
time.sleep(600)
"""


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stage_under_torchrun_stopped_by_its_pid_leaves_no_process(how, tmp_path):
    script = tmp_path / "stage.py"
    script.write_text(_STAGE)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(distributed.WORLD_SIZE_ENV, None)
    out = tmp_path / "up"
    stage = subprocess.Popen([sys.executable, str(script), str(out)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: all(os.path.exists(f"{out}.{rank}") for rank in (0, 1)), 120, "both ranks")
        tree = psutil.Process(stage.pid).children(recursive=True)
        assert len(tree) >= 4, tree  # the watchdog, torchrun, two ranks
        left = _stop_and_count(stage, tree, how)
        assert not left, left
    finally:
        if stage.poll() is None:
            stage.kill()
