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

    from noisydml.tracking import ensure_experiment

    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmp1"
    copy.mkdir(parents=True)
    (copy / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(tracking_uri())
    ensure_experiment("exp")
    ensure_experiment("exp")  # idempotent
    assert mlflow.get_experiment_by_name("exp").artifact_location == (tmp_path / "mlartifacts").as_uri()
    assert (tmp_path / "mlflow.db").is_file()
