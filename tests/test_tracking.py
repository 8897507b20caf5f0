from noisydml.tracking import flatten, repo_root, tracking_uri


def test_repo_root_is_the_folder_with_dvc_yaml(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "stages").mkdir()
    assert repo_root(tmp_path / "stages") == tmp_path


def test_temp_experiment_copies_track_into_the_main_repo(tmp_path, monkeypatch):
    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    (copy / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert repo_root(copy) == tmp_path
    assert tracking_uri(copy) == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_environment_overrides_the_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri(tmp_path) == "http://127.0.0.1:5000"


def test_flatten_nested_params():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}


def test_experiment_artifacts_live_in_the_main_repo(tmp_path, monkeypatch):
    import mlflow

    from noisydml.tracking import experiment_id

    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmp1"
    copy.mkdir(parents=True)
    (copy / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(tracking_uri())
    first = experiment_id(mlflow.MlflowClient(), "exp")
    assert experiment_id(mlflow.MlflowClient(), "exp") == first  # idempotent
    assert mlflow.get_experiment_by_name("exp").artifact_location == (tmp_path / "mlartifacts").as_uri()  # the main repo's
    assert (tmp_path / "mlflow.db").is_file()


def test_tracker_logs_in_order_resumes_and_survives_a_bad_run_id(tmp_path, monkeypatch, capsys):
    import mlflow

    from noisydml.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "note.txt").write_text("x")
    tracker = MlflowTracker("exp", "run-a", params={"a": {"b": 1}}, tags={"t": "1"})
    tracker.start()
    for step in (1, 2, 3):
        tracker.log_metrics({"loss": 1.0 / step}, step=step)
    tracker.log_artifact(tmp_path / "note.txt")
    run_id = tracker.run_id
    tracker.end()
    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"a.b": "1"} and run.data.tags["t"] == "1"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2, 3]
    # resume: the same run is re-opened and continued
    again = MlflowTracker("exp", "run-a", params={}, tags={})
    again.start(run_id)
    again.log_metrics({"loss": 0.1}, step=4)
    assert again.run_id == run_id
    again.end(status="KILLED")
    assert client.get_run(run_id).info.status == "KILLED" and len(client.get_metric_history(run_id, "loss")) == 4
    # a run id this database does not know (runs trained elsewhere): a warning and a new run
    other = MlflowTracker("exp", "run-b", params={}, tags={})
    other.start("0123456789abcdef")
    assert other.run_id not in (None, "0123456789abcdef")
    other.end()
    assert "re-opening run 0123456789abcdef" in capsys.readouterr().out


def test_a_run_left_open_does_not_hand_its_answer_to_the_next(tmp_path, monkeypatch):
    """Answers carry their run's ticket: a tracker started and never read or closed (a caller that forgot its end)
    leaves its answer in the pipe; the next run reads its own, not that one."""
    import mlflow

    from noisydml.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    forgotten = MlflowTracker("exp", "forgotten", params={}, tags={})
    forgotten.start()
    tracker = MlflowTracker("exp", "next", params={"x": 1}, tags={})
    tracker.start()
    run_id = tracker.run_id
    tracker.end()
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.run_name == "next" and run.data.params == {"x": "1"} and run.info.status == "FINISHED"


def test_tracker_failure_never_stops_training(tmp_path, monkeypatch, capsys):
    import sys

    import noisydml.tracking
    from noisydml.tracking import MlflowTracker

    # MLflow retries a failing database ~100 s: the tracking process runs here with no retries
    monkeypatch.setattr(noisydml.tracking, "TRACKING_COMMAND", (
        sys.executable, "-c", "import mlflow.store.db.utils as u; u.MAX_RETRY_COUNT = 0; "
                              "from noisydml.tracking import main; main()"))
    monkeypatch.setattr(noisydml.tracking, "_tracking_process", None)

    (tmp_path / "mlflow.db").mkdir()  # a database that cannot be opened
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker("exp", "run", params={}, tags={})
    tracker.start()
    tracker.log_metrics({"loss": 1.0}, step=1)
    assert tracker.run_id is None
    tracker.end()
    assert "warning: MLflow start failed" in capsys.readouterr().out


def test_no_tracking_thread_writes_the_environment(tmp_path, monkeypatch):
    """glibc's setenv in another thread racing getenv in the training thread crashed a stage (SIGSEGV in libc):
    no thread of the training process writes it (MLflow, which does, loads in the tracking process)."""
    import os
    import threading

    from noisydml.tracking import MlflowTracker

    writes = []
    put, unset = os.putenv, os.unsetenv
    monkeypatch.setattr(os, "putenv", lambda k, v: (writes.append((k, threading.current_thread().name)), put(k, v)))
    monkeypatch.setattr(os, "unsetenv", lambda k: (writes.append((k, threading.current_thread().name)), unset(k)))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "note.txt").write_text("x")
    tracker = MlflowTracker("exp", "run", params={"a": 1}, tags={"t": "1"})
    tracker.start()
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.log_artifact(tmp_path / "note.txt")
    assert tracker.run_id is not None
    tracker.end()
    # MLflow loads in the tracking process, its telemetry off there (the user may turn it on)
    import noisydml.tracking

    environ = open(f"/proc/{noisydml.tracking._tracking_process.process.pid}/environ", "rb").read().split(b"\0")
    assert b"MLFLOW_DISABLE_TELEMETRY=true" in environ
    assert [w for w in writes if w[1] != "MainThread"] == []


def test_stages_that_start_together_on_a_new_store_are_all_tracked(tmp_path, monkeypatch):
    """Two stages opening a new SQLite store at once raced to create its schema and one run went untracked
    ("table ... already exists"); the schema is now created under a file lock. Four tracking processes (as four
    stages would start them) open a new store at the same moment: every run is tracked (without the lock, this
    failed on its first attempt here)."""
    import json
    import subprocess
    import sys

    import mlflow

    for attempt in range(1):
        uri = f"sqlite:///{tmp_path / f'store{attempt}' / 'mlflow.db'}"
        processes = [subprocess.Popen([sys.executable, "-m", "noisydml.tracking"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)
                     for _ in range(4)]
        for i, process in enumerate(processes):
            process.stdin.write(json.dumps({"op": "start", "ticket": 0, "uri": uri, "experiment": "exp",
                                            "run_name": f"run{i}", "params": {}, "tags": {}, "resume_id": None}) + "\n")
            process.stdin.flush()
        answers = [json.loads(process.stdout.readline()) for process in processes]
        for process in processes:
            process.stdin.close()
            process.wait(timeout=60)
        assert all(a["run_id"] for a in answers), answers
        runs = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name("exp").experiment_id])
        assert sorted(r.info.run_name for r in runs) == ["run0", "run1", "run2", "run3"]


def _tracked_run_with(artifact):
    """One run of experiment ``exp`` in the environment's store, ``artifact`` logged; its id."""
    from noisydml.tracking import MlflowTracker

    tracker = MlflowTracker("exp", "run", params={}, tags={})
    tracker.start()
    tracker.log_artifact(artifact)
    run_id = tracker.run_id
    tracker.end()
    return run_id


def test_artifacts_go_beside_the_store_whatever_the_working_directory(tmp_path, monkeypatch):
    """A store's artifacts live in mlartifacts/ beside its database: a test's store (or any other URI) never writes
    into the repository the process happens to run in."""
    from noisydml.tracking import artifact_root

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(repo)
    store = tmp_path / "elsewhere" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    assert artifact_root() == (store.parent / "mlartifacts").as_uri()
    assert artifact_root("http://127.0.0.1:5000") is None  # a server keeps its own
    (repo / "note.txt").write_text("x")
    run_id = _tracked_run_with(repo / "note.txt")
    assert run_id and (store.parent / "mlartifacts" / run_id / "artifacts" / "note.txt").is_file()
    assert not (repo / "mlartifacts").exists()


def test_a_moved_store_opens_its_artifacts(tmp_path, monkeypatch):
    """MLflow records absolute artifact locations: a repository copied or re-cloned with its mlflow.db and
    mlartifacts/ (the original gone) opens its artifacts once the store is opened again (relocate_artifacts)."""
    import shutil

    import mlflow

    from noisydml.tracking import open_store

    first = tmp_path / "first"
    first.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{first / 'mlflow.db'}")
    (tmp_path / "history.csv").write_text("epoch,loss\n1,0.5\n")
    run_id = _tracked_run_with(tmp_path / "history.csv")
    import noisydml.tracking

    noisydml.tracking._tracking_process = None  # its tracking process holds the first store open
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    shutil.rmtree(first)
    client = open_store(f"sqlite:///{moved / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.artifact_uri == (moved / "mlartifacts" / run_id / "artifacts").as_uri()
    assert client.get_experiment_by_name("exp").artifact_location == (moved / "mlartifacts").as_uri()
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="history.csv",
                                                tracking_uri=f"sqlite:///{moved / 'mlflow.db'}",
                                                dst_path=str(tmp_path / "out"))
    assert open(local).read().startswith("epoch,loss")
