"""The Ray launcher (noisydml.tools.launch): the stale stages at once, recorded in dvc.lock as `dvc repro` would.

A toy DVC project (shell stages, no torch) checks the graph's rules; the end-to-end test runs a small grid with a
chain on a loopback Ray cluster of two nodes (1 CPU each) against an MLflow tracking server, kills a training
stage's Ray worker mid-run, and compares dvc.lock and every output with a serial `dvc repro` of the same params.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, dvc_repo, run_command, tiny_params

pytestmark = pytest.mark.e2e

TOY = {
    "stages": {
        "a": {"cmd": "echo a > a.txt", "outs": ["a.txt"]},
        "b": {"cmd": "cat a.txt > b.txt && test ! -e fail_b", "deps": ["a.txt"], "outs": ["b.txt"]},
        "c": {"cmd": "cat b.txt > c.txt", "deps": ["b.txt"], "outs": ["c.txt"]},
        "d": {"cmd": "cat a.txt a.txt > d.txt", "deps": ["a.txt"], "outs": ["d.txt"]},
    }
}


def _launch(root, env, *args, check=True, timeout=900):
    proc = subprocess.run([sys.executable, "-m", "noisydml.tools.launch", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"launch exited {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return proc


def _lock(root):
    return yaml.safe_load((root / "dvc.lock").read_text())


def _toy_repo(root, env):
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump(TOY, sort_keys=False))
    (root / "params.yaml").write_text("runtime: {threads: 1}\n")
    run_command(["git", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "init", "-q"], root, env)


def test_a_failing_stage_stops_its_descendants_only_and_the_next_launch_finishes(tmp_path):
    from noisydml.tools.rehearsal import stage_env

    env = stage_env()
    root = tmp_path / "toy"
    _toy_repo(root, env)
    (root / "fail_b").touch()
    proc = _launch(root, env, "-j", "2", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = {s["stage"]: s["status"] for s in json.loads((root / ".runinfo/launch/summary.json").read_text())["stages"]}
    assert summary == {"a": "ran", "b": "failed", "c": "not run", "d": "ran"}
    assert "FAILED b" in proc.stderr and "not run (they need a failed stage): c" in proc.stderr
    assert set(_lock(root)["stages"]) == {"a", "d"}  # the sibling d is recorded, the failed branch is not

    (root / "fail_b").unlink()
    proc = _launch(root, env, "-j", "2")
    summary = {s["stage"]: s["status"] for s in json.loads((root / ".runinfo/launch/summary.json").read_text())["stages"]}
    assert summary == {"a": "unchanged", "b": "ran", "c": "ran", "d": "unchanged"}
    status = run_command([sys.executable, "-m", "dvc", "status"], root, env)
    assert "up to date" in status
    launched = _lock(root)

    # a serial `dvc repro` from scratch writes the same lock (the order of its entries aside)
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "dvc.lock"):
        (root / name).unlink()
    shutil.rmtree(root / ".dvc" / "cache")
    run_command([sys.executable, "-m", "dvc", "repro", "-q"], root, env)
    assert _lock(root) == launched


def test_bookkeeping_beside_an_output_does_not_change_a_folder_dependency(tmp_path):
    """Beside an output, in the folder a later stage depends on (`evaluate@<dataset>` on `runs/<dataset>`): the
    temporaries of a stage killed inside ``io.atomic_dir``, and the .gitignore DVC writes, whose lines come in the
    order the stages were recorded (the launcher's differs from `dvc repro`'s). The project's .dvcignore keeps
    both out of DVC's hash."""
    from noisydml.tools.rehearsal import stage_env

    env = stage_env()
    root = tmp_path / "toy"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "write": {"cmd": "mkdir -p runs/seed0 && echo w > runs/seed0/model.txt", "outs": ["runs/seed0"]},
        "read": {"cmd": "ls -R runs > listing.txt", "deps": ["runs"], "outs": ["listing.txt"]}}}))
    shutil.copy(REPO / ".dvcignore", root / ".dvcignore")
    run_command(["git", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "repro", "-q"], root, env)
    for leftover in (".seed0.k3x_9q2a.tmp", ".seed0.old"):
        (root / "runs" / leftover).mkdir()
        (root / "runs" / leftover / "model.txt").write_text("half")
    (root / "runs" / ".model.txt.abcdefgh.tmp").write_text("half")
    gitignore = root / "runs" / ".gitignore"
    assert gitignore.read_text() == "/seed0\n"  # DVC's
    gitignore.write_text("/seed1\n/seed0\n")  # as if another stage's output had been recorded first
    assert "up to date" in run_command([sys.executable, "-m", "dvc", "status"], root, env)
    (root / "runs" / "stray.txt").write_text("not ours")  # anything else still counts
    assert "read" in run_command([sys.executable, "-m", "dvc", "status"], root, env)


def test_lock_entries_are_written_when_the_driver_waits_or_in_batches_a_tenth_of_the_lock():
    """dvc.lock is parsed and rewritten whole per write: one write per stage made 300 no-op stages take 608 s
    (scripts/bench_dvc_scale.py). Real stages are written as soon as the driver waits; a burst in batches."""
    from noisydml.tools.launch import LockWriter

    writer = LockWriter(repo=None, already_written=100)
    assert not writer.due(idle=True)  # nothing to write
    writer.add("stage")
    assert writer.due(idle=True) and not writer.due(idle=False)
    writer.unwritten = ["stage"] * 9
    assert not writer.due(idle=False)
    writer.add("stage")
    assert writer.due(idle=False)  # 10 of 100: a tenth
    assert LockWriter(repo=None, already_written=0).due(idle=False) is False
    first = LockWriter(repo=None, already_written=0)
    first.add("stage")
    assert first.due(idle=False)  # the first entries are written one at a time


def test_a_ctrl_c_during_the_lock_write_waits_until_the_file_is_whole():
    """DVC rewrites dvc.lock in place; a Ctrl-C (or SIGTERM) in the middle cut it short. The writer holds both
    signals until the write is done, then raises KeyboardInterrupt."""
    from noisydml.tools.launch import LockWriter

    written = []

    class Dvcfile:
        path = "dvc.yaml"

        def dump_stages(self, stages, update_pipeline):
            os.kill(os.getpid(), signal.SIGINT)  # arrives mid-write
            os.kill(os.getpid(), signal.SIGTERM)
            written.extend(stages)

    class Stage:
        dvcfile = Dvcfile()

    class Repo:
        lock = contextlib.nullcontext()

    # Python's own handler, as the launcher sets it: a worker started with SIGINT ignored (a detached shell's
    # background job) would otherwise hand the writer SIG_IGN to put back
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        writer = LockWriter(Repo(), already_written=0)
        writer.add(Stage())
        with pytest.raises(KeyboardInterrupt):
            writer.write()
        assert len(written) == 1 and writer.unwritten == [] and writer.written == 1
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_an_override_the_schema_refuses_stops_the_launch_before_anything_runs(tmp_path):
    from noisydml.tools.rehearsal import stage_env

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    proc = _launch(tmp_path, stage_env(), "-S", "train.epochs=-1", check=False)
    assert proc.returncode == 2 and "train.epochs" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / ".runinfo").exists()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM by its PID"])
def test_ctrl_c_cancels_the_running_stage_kills_its_process_and_leaves_it_stale(how, tmp_path):
    import psutil

    from noisydml.tools.rehearsal import stage_env

    env = stage_env()
    root = tmp_path / "toy"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "quick": {"cmd": "echo q > q.txt", "outs": ["q.txt"]},
        "slow": {"cmd": "sleep 600", "outs": ["s.txt"]}}}))
    (root / "params.yaml").write_text("runtime: {threads: 1}\n")
    run_command(["git", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    launcher = subprocess.Popen([sys.executable, "-m", "noisydml.tools.launch", "-j", "2"], cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    sleeper = None
    while time.time() < deadline and (sleeper is None or not (root / "dvc.lock").exists()):  # quick recorded
        time.sleep(0.2)
        sleeper = next((p for p in psutil.process_iter(["cmdline"])
                        if (p.info["cmdline"] or []) == ["sleep", "600"]), None)
    assert sleeper is not None
    launcher.send_signal(how)
    out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, out
    assert "interrupted" in out
    summary = {s["stage"]: s["status"] for s in json.loads((root / ".runinfo/launch/summary.json").read_text())["stages"]}
    assert summary["slow"] == "cancelled"
    sleeper.wait(timeout=30)  # the stage's process died with its cancelled worker
    assert set(_lock(root)["stages"]) == {"quick"}
    status = run_command([sys.executable, "-m", "dvc", "status", "slow"], root, env)
    assert "slow" in status  # still stale: `dvc repro` or the next launch runs it


def _cmdline(process) -> list[str]:
    """A process's command line, or [] when it ended between being listed and being read (a race, not a failure)."""
    import psutil

    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def test_a_launcher_killed_outright_leaves_no_process_behind_and_dry_says_what_would_run(tmp_path):
    """SIGKILL on the driver (no handler runs): its watchdog kills the local Ray instance (GCS, raylet, the agents
    that ignore SIGTERM, the workers) and the stage's process. Counted: every process the driver recorded, and
    every process whose command line names the instance's session. Then `--dry` names the stage still to run."""
    import psutil

    from noisydml.tools.rehearsal import stage_env

    env = stage_env()
    root = tmp_path / "toy"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"slow": {"cmd": "sleep 600", "outs": ["s.txt"]}}}))
    (root / "params.yaml").write_text("runtime: {threads: 1}\n")
    run_command(["git", "init", "-q"], root, env)
    run_command([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    launcher = subprocess.Popen([sys.executable, "-m", "noisydml.tools.launch", "-j", "1"], cwd=root, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = root / ".runinfo" / "launch" / "ray-processes.json"
    deadline, sleeper = time.time() + 120, None
    while time.time() < deadline and sleeper is None:
        time.sleep(0.3)
        sleeper = next((p for p in psutil.Process(launcher.pid).children(recursive=True)
                        if _cmdline(p) == ["sleep", "600"]), None)
    assert sleeper is not None and record.is_file()
    time.sleep(1.5)  # the driver records the processes Ray started for the running stage
    recorded = [psutil.Process(pid) for pid, _ in json.loads(record.read_text())["processes"] if psutil.pid_exists(pid)]
    assert len(recorded) >= 4, recorded  # GCS, raylet, the agents, a worker
    launcher.kill()
    launcher.wait(timeout=30)
    gone, alive = psutil.wait_procs([*recorded, sleeper], timeout=60)
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert not record.exists()  # reaped: the next launch has nothing to kill

    dry = _launch(root, env, "--dry")
    assert "would run  slow" in dry.stdout and "1 of 1 stages would run" in dry.stdout, dry.stdout
    assert not (root / "s.txt").exists()


def test_the_console_says_running_and_queued_apart_each_epoch_and_an_estimate():
    from noisydml.tools.launch import epoch_lines

    row = ("prism epoch 2/12:  74%|###| 74/100\r" + " " * 20 + "\repoch=2 loss=0.4866 lr=0.0002333 "
           "diag_kept_fraction=0.5238 test_mean_average_precision_at_r=0.1 test_precision_at_1=0.5117 "
           "epoch_seconds=2.9\n")
    assert epoch_lines(row) == ["epoch 2/12, loss 0.4866, monitor P@1 51.2 (2.9 s)"]
    assert epoch_lines("epoch=3 loss=0.5") == []  # a row still being written


def test_a_run_that_went_untracked_is_said_on_the_console_and_counted(tmp_path):
    """The stage's own warning (noisydml.tracking) is picked out of its log; the summary counts the stage."""
    from noisydml.tools.launch import Outcome, tracking_warnings, write_summary
    from noisydml.tracking import TRACKING_WARNING

    log = tmp_path / "train@x.log"
    log.write_text(f"epoch=1 loss=1 epoch_seconds=1\r{TRACKING_WARNING} start failed (OperationalError: table "
                   "assessments already exists); the stage goes on without tracking\nepoch=2\n")
    warnings = tracking_warnings(log)
    assert len(warnings) == 1 and "already exists" in warnings[0]
    write_summary(tmp_path, [Outcome("train@x", "ran", seconds=3.0, tracking_warnings=warnings),
                             Outcome("train@y", "ran", seconds=4.0)], 10.0, 2, None)
    summary = json.loads((tmp_path / ".runinfo/launch/summary.json").read_text())
    assert summary["untracked_stages"] == ["train@x"]
    assert json.loads((tmp_path / ".runinfo/launch/durations.json").read_text()) == {"train@x": 3.0, "train@y": 4.0}


# ------------------------------------------------------------------------------------ two nodes, a grid, a kill


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(args, env):
    ray = Path(sys.executable).parent / "ray"
    return run_command([str(ray), *args], Path.cwd(), env, timeout=180)


@pytest.fixture(scope="module")
def cluster():
    """A Ray cluster of two nodes on 127.0.0.1 with 1 CPU each (the head and one worker node), and an MLflow
    tracking server."""
    from noisydml.tools.rehearsal import stage_env

    env = stage_env()
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "token"  # every node and the driver present the token of ~/.ray/auth_token
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay short
    port, mlflow_port = _free_port(), _free_port()
    server = None
    try:
        _ray(["start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0",
              "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"], env)
        _ray(["start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
              "--num-gpus=0", "--disable-usage-stats"], env)
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
                                   str(mlflow_port), "--backend-store-uri", f"sqlite:///{temp / 'mlflow.db'}",
                                   "--default-artifact-root", (temp / "artifacts").as_uri(), "--workers", "1"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        for _ in range(240):
            try:
                socket.create_connection(("127.0.0.1", mlflow_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "env": env, "tracking_uri": f"http://127.0.0.1:{mlflow_port}"}
    finally:
        if server is not None:
            os.killpg(server.pid, 9)
        _stop_cluster(temp, port)


def _stop_cluster(temp, port):
    """This cluster's processes only (`ray stop` would stop every Ray instance of the machine)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(temp) in part or f"127.0.0.1:{port}" in part for part in proc.info["cmdline"] or []):
                for child in proc.children(recursive=True):  # agents whose command line is their title only
                    child.kill()
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    shutil.rmtree(temp, ignore_errors=True)


def _grid_params():
    with open(REPO / "params.yaml") as f:
        raw = tiny_params(yaml.safe_load(f))
    # one noise: two training runs at once (one per node) and the chain after one of them
    raw["grid"].update(noises=["sym50"], methods=["ms", "prism"], seeds=[0], run_noises=[])
    raw["noise_runs"] = {}
    raw["methods"]["prism"]["memory_size"] = 64
    raw["figures"]["bspml_maps"] = {}
    raw["train"]["pretrained"] = "none"
    for section in raw["methods"].values():
        if isinstance(section, dict) and "freeze_backbone" in section:
            section["freeze_backbone"] = False
    raw["train"]["epochs"] = 6  # room to kill a run between two of its checkpoints
    raw["chains"] = {"ms_on_prism_kept": {"name": "ms_on_prism_kept", "dataset": "glyphs", "noise": "sym50",
                                          "seeds": "grid", "method": "ms", "upstream": "prism",
                                          "init": {"model": True, "method": False},
                                          "labels": {"label": "", "keep": "keep"}, "inputs": []}}
    raw["timing"]["entries"] = {}
    return raw


def _outputs(root):
    """Every DVC output of the lock: path -> md5."""
    return {out["path"]: out["md5"] for stage in _lock(root)["stages"].values() for out in stage.get("outs", [])}


def _differences(left, right, where=""):
    """Every leaf where two parsed lock files differ, as ``(where, left, right)``: a readable failure where
    pytest's repr of two whole locks hides the difference."""
    if isinstance(left, dict) and isinstance(right, dict):
        return [d for key in sorted(set(left) | set(right), key=str)
                for d in _differences(left.get(key, "<absent>"), right.get(key, "<absent>"), f"{where}/{key}")]
    if isinstance(left, list) and isinstance(right, list) and all(isinstance(x, dict) and "path" in x
                                                                 for x in left + right):
        return _differences({x["path"]: x for x in left}, {x["path"]: x for x in right}, where)
    return [] if left == right else [(where, left, right)]


def _kill_worker_of(root, stage, checkpoint, killed):
    """When the run's first checkpoint is written, SIGKILL the Ray worker running its stage (Ray names the worker
    process after the task, the stage); Ray retries the task."""
    import psutil

    deadline = time.time() + 600
    while time.time() < deadline and not (root / checkpoint).exists():
        time.sleep(0.02)
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        if title.startswith("ray::") and stage in title:
            killed.append({"pid": proc.pid, "title": title})
            proc.kill()
            return


def test_a_grid_with_a_chain_on_two_nodes_matches_a_serial_repro_through_a_worker_kill(tmp_path, cluster):
    raw = _grid_params()
    serial = tmp_path / "serial"
    serial.mkdir()
    dvc_repo(serial, raw)

    launched = tmp_path / "launched"
    launched.mkdir()
    # the launcher applies -S as `dvc exp run -S` does (DVC's own code), before it plans
    env, _ = dvc_repo(launched, {**raw, "train": {**raw["train"], "epochs": 5}}, repro=False)
    victim = "train@glyphs-sym50-prism-0"
    killed = []
    killer = threading.Thread(target=_kill_worker_of, daemon=True, args=(
        launched, victim, ".checkpoints/glyphs/sym50/prism/seed0/last.pt", killed))
    killer.start()
    proc = _launch(launched, {**env, "RAY_AUTH_MODE": "token"},
                   "--address", cluster["address"], "--tracking-uri", cluster["tracking_uri"],
                   "-S", f"train.epochs={raw['train']['epochs']}")
    killer.join(timeout=5)

    # the worker was killed mid-run, Ray retried the task, and the run resumed from its checkpoint
    assert killed, proc.stdout[-3000:]
    assert not psutil_exists(killed[0]["pid"])
    log = (launched / f".runinfo/launch/{victim}.log").read_text()
    assert "resuming from" in log, log[-3000:]

    # both nodes ran stages
    summary = json.loads((launched / ".runinfo/launch/summary.json").read_text())
    assert {s["status"] for s in summary["stages"]} == {"ran"}, proc.stdout[-4000:]
    assert len({s["host"] for s in summary["stages"]}) == 2

    # the same dvc.lock and outputs as the serial repro; status clean; a repro does nothing
    assert _outputs(launched) == _outputs(serial)
    assert _differences(_lock(launched), _lock(serial)) == [], sorted(
        str(p.relative_to(launched)) for p in launched.rglob(".*") if ".dvc" not in p.parts and ".git" not in p.parts)
    run = [sys.executable, "-m", "dvc"]
    assert "up to date" in run_command([*run, "status"], launched, env)
    assert "didn't change" in run_command([*run, "repro"], launched, env)
    assert not (launched / ".checkpoints").exists() or not any((launched / ".checkpoints").rglob("*.pt"))

    # every training run is one FINISHED run on the tracking server, the killed one included
    code = ("import mlflow, json; mlflow.set_tracking_uri(%r); runs = mlflow.search_runs(search_all_experiments=True);"
            "print(json.dumps(sorted(zip(runs['tags.mlflow.runName'], runs['status']))))" % cluster["tracking_uri"])
    runs = json.loads(run_command([sys.executable, "-c", code], launched, env).strip().splitlines()[-1])
    assert runs == sorted([[f"{m} · sym50 · seed 0", "FINISHED"] for m in ("ms", "prism")]
                          + [["ms_on_prism_kept · sym50 · seed 0", "FINISHED"]])


def psutil_exists(pid):
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
