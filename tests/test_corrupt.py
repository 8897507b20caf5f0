"""The corrupt stage on a prepared dataset: outputs, features, and errors raised before anything is written."""

import copy

import numpy as np
import pandas as pd
import pytest

from noisydml import io
from noisydml.config import ParamsError
from noisydml.runs import runs_of
from noisydml.tools.check import validate_all as validate_params
from noisydml.data import DatasetError
from noisydml.data.prepared import write_prepared
from noisydml.noise import NoiseInputError
from noisydml.pipeline.corrupt import corrupt
from noisydml.pipeline.layout import TRAIN_EMBEDDINGS, Layout
from noisydml.pipeline.rundata import check_features_fresh


def _prepare(layout, num_classes=16, per_class=6, is_clean=None, side=8):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(num_classes), per_class)
    # class-dependent pixels, so PCA features carry class structure
    base = rng.integers(0, 256, size=(num_classes, side, side, 1))
    images = np.clip(base[labels] + rng.integers(-20, 20, size=(len(labels), side, side, 1)), 0, 255).astype(np.uint8)
    names = [f"class{i}" for i in range(num_classes)]
    write_prepared(layout.prepared("toy"), images, labels, names, {"kind": "test"}, is_clean=is_clean)


def _params(raw_params, noise_runs=None, **noise):
    raw = copy.deepcopy(raw_params)
    raw["datasets"]["toy"] = {"kind": "glyphs", "num_classes": 16, "images_per_class": 6}
    raw["noise"].update(noise)
    from_run = [n for n, cfg in noise.items() if (cfg.get("features") or {}).get("source") == "run"]
    raw["grid"].update(datasets=["toy"], noises=["clean", *(n for n in noise if n not in from_run)],
                       run_noises=from_run)
    raw["noise_runs"] = noise_runs or {}
    raw["chains"] = {}
    raw["timing"].update(noise="clean", dataset="toy")
    raw["train"]["batch"] = {"classes": 2, "per_class": 2}
    return validate_params(raw)


def test_small_cluster_from_pixels_writes_labels_stats_and_per_class(tmp_path, raw_params):
    layout = Layout(tmp_path)
    _prepare(layout)
    params = _params(raw_params, sc={"kind": "small_cluster", "rate": 0.5, "seed": 0,
                                     "features": {"source": "pixels", "pca_dim": 8}})
    stats = corrupt(params, "toy", "sc", layout)
    out = layout.noisy("toy", "sc")
    table = pd.read_csv(out / "labels.csv")
    assert stats == io.read_json(out / "stats.json")
    assert stats["num_classes_before"] == 8 and stats["num_classes_after"] == 4
    assert stats["features"] == {"source": "pixels", "pca_dim": 8, "pixel_side": 32}
    assert sorted(table["label"].unique()) == [0, 1, 2, 3]
    per_class = pd.read_csv(out / "per_class.csv")
    assert per_class["class_name"].tolist() == [f"class{i}" for i in range(8)]
    assert (per_class["label"] < 0).sum() == 4
    # same params, same labels, bit for bit
    corrupt(params, "toy", "sc", Layout(tmp_path))
    assert (out / "labels.csv").read_bytes() == table.to_csv(index=False).encode()


def test_pca_dim_above_pixel_count_is_an_error(tmp_path, raw_params):
    layout = Layout(tmp_path)
    _prepare(layout)
    params = _params(raw_params, sc={"kind": "small_cluster", "rate": 0.5, "features": {"pca_dim": 65}})
    with pytest.raises(NoiseInputError, match="pca_dim 65 is larger than the 64 pixel values"):
        corrupt(params, "toy", "sc", layout)
    assert not layout.noisy("toy", "sc").exists()


def test_rate_that_dissolves_every_class_writes_nothing(tmp_path, raw_params):
    layout = Layout(tmp_path)
    _prepare(layout, num_classes=8)  # 4 training classes of 6
    params = _params(raw_params, sc={"kind": "small_cluster", "rate": 0.9})
    with pytest.raises(NoiseInputError, match="would dissolve every one of the 4 classes"):
        corrupt(params, "toy", "sc", layout)
    assert not layout.noisy("toy", "sc").exists()


def _write_run_embeddings(layout, sample_ids, dim=4, seed=0):
    run = layout.run("toy", "clean", "ms", 0)
    run.mkdir(parents=True, exist_ok=True)
    emb = np.random.default_rng(seed).standard_normal((len(sample_ids), dim)).astype(np.float32)
    np.savez(run / TRAIN_EMBEDDINGS, embeddings=emb, sample_ids=sample_ids)
    return run / TRAIN_EMBEDDINGS


RUN_FEATURES = {"kind": "small_cluster", "rate": 0.5, "features": {"source": "run"}}
NOISE_RUNS = {"toy-scrun": {"dataset": "toy", "noise": "scrun", "run": {"noise": "clean", "method": "ms", "seed": 0}}}


def test_small_cluster_from_run_embeddings_and_freshness_check(tmp_path, raw_params):
    layout = Layout(tmp_path)
    _prepare(layout)
    params = _params(raw_params, NOISE_RUNS, scrun=RUN_FEATURES)
    with pytest.raises(FileNotFoundError, match=r"train it first \(`dvc repro train@toy-clean-ms-0`\)"):
        corrupt(params, "toy", "scrun", layout)
    assert not layout.noisy("toy", "scrun").exists()
    path = _write_run_embeddings(layout, np.arange(48)[::-1].copy())  # any row order
    stats = corrupt(params, "toy", "scrun", layout)
    assert stats["features"]["run"] == "toy-clean-ms-0" and len(stats["features"]["sha256"]) == 64
    check_features_fresh(stats, layout)
    # the run is retrained: labels made from its old embeddings must not be trained on
    _write_run_embeddings(layout, np.arange(48), seed=1)
    with pytest.raises(DatasetError, match=r"stage corrupt_from_run@toy-scrun"):
        check_features_fresh(stats, layout)
    path.unlink()
    with pytest.raises(DatasetError, match="have changed \\(or gone\\)"):
        check_features_fresh(stats, layout)


def test_run_features_that_do_not_match_the_manifest(tmp_path, raw_params):
    layout = Layout(tmp_path)
    _prepare(layout)
    params = _params(raw_params, NOISE_RUNS, scrun=RUN_FEATURES)
    _write_run_embeddings(layout, np.arange(47))
    with pytest.raises(NoiseInputError, match="features do not match the manifest's training split: 47 rows for 48"):
        corrupt(params, "toy", "scrun", layout)
    assert not layout.noisy("toy", "scrun").exists()


def test_real_noise_flags_reach_the_statistics(tmp_path, raw_params):
    layout = Layout(tmp_path)
    flags = np.full(96, np.nan)
    flags[:10] = [1, 0, 1, 1, 0, 1, 1, 1, 1, 1]
    _prepare(layout, is_clean=flags)
    stats = corrupt(_params(raw_params), "toy", "clean", layout)
    assert stats["verified"]["num_verified"] == 10 and stats["verified"]["num_verified_noisy"] == 2
    table = pd.read_csv(layout.noisy("toy", "clean") / "labels.csv")
    assert table["is_noisy"].sum() == 2


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"kind": "small_cluster", "rate": 1.0}, r"noise.bad.rate: 1.0 would dissolve every class"),
        ({"kind": "small_cluster", "rate": -0.1}, r"noise.bad.rate: -0.1 is below the minimum 0.0"),
        ({"kind": "symmetric_per_class", "rate": 1.5}, r"noise.bad.rate: 1.5 is above the maximum 1.0"),
        ({"kind": "small_cluster", "rate": 0.5, "features": {"source": "pixels", "method": "ms"}},
         r"noise.bad.features: unknown key 'method'"),
        ({"kind": "small_cluster", "rate": 0.5, "features": {"source": "run"}},
         r"grid.noises\[1\]: 'bad' is clustered on a run's embeddings .* list it in grid.run_noises"),
        ({"kind": "small_cluster", "rate": 0.5, "features": {"source": "web"}}, r"features.source: 'web' is not allowed"),
    ],
)
def test_bad_noise_settings_are_refused_at_load_time(raw_params, setting, message):
    raw = copy.deepcopy(raw_params)
    raw["noise"]["bad"] = setting
    raw["grid"]["noises"] = ["clean", "bad"]
    raw["chains"] = {}
    raw["timing"].update(noise="clean")
    with pytest.raises(ParamsError, match=message):
        validate_params(raw)


def _run_noise_params(raw_params, entry=None, key="glyphs-scrun", run_noises=("scrun",)):
    raw = copy.deepcopy(raw_params)
    raw["noise"]["scrun"] = RUN_FEATURES
    raw["grid"]["run_noises"] = list(run_noises)
    run = {"noise": "clean", "method": "ms", "seed": 0}
    raw["noise_runs"] = {key: {"dataset": "glyphs", "noise": "scrun", "run": run, **(entry or {})}}
    raw["chains"] = {}
    return raw


@pytest.mark.parametrize(
    "entry, key, run_noises, message",
    [
        (None, "glyphs-scrun", ("scrun",), None),
        (None, "scrun", ("scrun",), r"noise_runs.scrun: the key must be 'glyphs-scrun'"),
        ({"run": {"noise": "sym20", "method": "ms", "seed": 0}}, "glyphs-scrun", ("scrun",),
         r"noise_runs.glyphs-scrun.run.noise: 'sym20' is not in grid.noises .* must be one the grid trains"),
        ({"run": {"noise": "clean", "method": "ms", "seed": 3}}, "glyphs-scrun", ("scrun",),
         r"noise_runs.glyphs-scrun.run.seed: 3 is not in grid.seeds"),
        ({"noise": "sc50"}, "glyphs-sc50", (), r"noise_runs.glyphs-sc50.noise: 'sc50' does not cluster a run"),
        ({"dataset": "cub"}, "cub-scrun", (), r"noise_runs.cub-scrun.dataset: unknown dataset of grid.datasets 'cub'; allowed: glyphs"),
        (None, "glyphs-scrun", ("scrun", "sc50"), r"grid.run_noises\[1\]: 'sc50' is not clustered on a run"),
    ],
)
def test_run_sourced_noise_entries_are_checked(raw_params, entry, key, run_noises, message):
    raw = _run_noise_params(raw_params, entry, key, run_noises)
    if message is None:
        params = validate_params(raw)
        assert "runs/glyphs/scrun/ms/seed0" in [r.folder for r in runs_of(params) if r.kind.name == "grid"]
        return
    with pytest.raises(ParamsError, match=message):
        validate_params(raw)


def test_the_run_named_inside_the_noise_setting_points_to_noise_runs(raw_params):
    raw = _run_noise_params(raw_params)
    raw["noise"]["scrun"] = {**RUN_FEATURES, "features": {"source": "run", "noise": "clean", "method": "ms"}}
    with pytest.raises(ParamsError, match=r"noise.scrun.features.method: the run whose embeddings are clustered is "
                                          r"named per dataset in noise_runs"):
        validate_params(raw)


def test_a_run_noise_without_its_run_named_is_refused(raw_params):
    raw = _run_noise_params(raw_params)
    raw["noise_runs"] = {}
    with pytest.raises(ParamsError, match=r"grid.run_noises: 'scrun' on dataset 'glyphs' needs noise_runs.glyphs-scrun"):
        validate_params(raw)


def test_validation_split_holds_out_whole_classes_the_same_for_every_method(tmp_path, raw_params):
    from noisydml.pipeline.rundata import load_run_data

    layout = Layout(tmp_path)
    _prepare(layout)
    corrupt(_params(raw_params), "toy", "clean", layout)
    data = load_run_data("toy", "clean", layout, validation_classes=2, seed=3)
    assert sorted(np.concatenate([data.fit_index, data.val_index]).tolist()) == list(range(48))
    assert len(np.unique(data.val_set.labels)) == 2
    assert not set(data.val_set.labels) & set(data.noisy["label"].to_numpy()[data.fit_index])
    assert sorted(np.unique(data.train_set.labels)) == list(range(6))  # renumbered for training
    again = load_run_data("toy", "clean", layout, validation_classes=2, seed=3)
    assert np.array_equal(again.val_index, data.val_index)


class _NoTracking:
    def __init__(self, *args, **kwargs):
        pass

    run_id = None

    def start(self, run_id=None):
        return None

    def log_metrics(self, *args, **kwargs):
        pass

    def log_artifact(self, *args, **kwargs):
        pass

    def end(self, *args, **kwargs):
        pass


def test_train_stage_with_validation_writes_embeddings_of_every_training_sample(tmp_path, raw_params, monkeypatch):
    import noisydml.pipeline.train
    from noisydml.pipeline.train import train
    from noisydml.runs import find_runs, runs_of

    monkeypatch.setattr(noisydml.pipeline.train, "MlflowTracker", _NoTracking)
    layout = Layout(tmp_path)
    _prepare(layout, side=16)
    raw = copy.deepcopy(raw_params)
    raw["train"].update(epochs=2, eval_every=1, backbone_width=4, embedding_dim=8, validation_classes=2,
                        model_selection="best_validation")
    params = _params(raw)
    corrupt(params, "toy", "clean", layout)
    out = train(params, *find_runs(runs_of(params), "runs/toy/clean/ms/seed0", "params"), layout)
    info = io.read_json(out / "run.json")
    history = pd.read_csv(out / "history.csv")
    assert info["selected_epoch"] == 1 + int(history["val_precision_at_1"].to_numpy().argmax())
    emb = np.load(out / TRAIN_EMBEDDINGS)
    assert emb["embeddings"].shape == (48, 8) and np.array_equal(emb["sample_ids"], np.arange(48))
    assert np.allclose(np.linalg.norm(emb["embeddings"], axis=1), 1.0, atol=1e-5)  # held-out rows filled too


def test_a_chain_trains_every_grid_seed_in_one_stage_and_a_kill_in_its_second_seed_keeps_the_first(
        tmp_path, raw_params, monkeypatch, capsys):
    """``seeds: grid``: the chain's stage (``--run-folder runs/<d>/<n>/<name>``) trains seed 0 then seed 1. Killed
    in seed 1, the stage run again (its output emptied first, as DVC does) re-writes seed 0 from its kept final
    checkpoint without training it, and both seeds come out byte for byte as in an uninterrupted stage."""
    import argparse
    import shutil

    import noisydml.pipeline.train as stage

    monkeypatch.setattr(stage, "MlflowTracker", _NoTracking)
    monkeypatch.chdir(tmp_path)  # the stage's layout is the working directory, as under DVC
    layout = Layout()
    _prepare(layout, side=16)
    raw = copy.deepcopy(raw_params)
    raw["train"].update(epochs=2, eval_every=1, backbone_width=4, embedding_dim=8)
    raw["grid"].update(methods=["prism"], seeds=[0, 1])
    params = _params(raw)
    params["chains"] = {"after": {"name": "ms_after", "dataset": "toy", "noise": "clean", "seeds": [0, 1],
                                  "method": "ms", "upstream": "prism", "init": {"model": True, "method": False},
                                  "labels": {"label": "", "keep": "keep", "kind": "label_ids"}, "inputs": [],
                                  "hparams": {}, "train": {}}}
    corrupt(params, "toy", "clean", layout)
    for seed in (0, 1):
        stage.run_from_arguments(params, argparse.Namespace(run_folder=f"runs/toy/clean/prism/seed{seed}", study=None))
    chain = argparse.Namespace(run_folder="runs/toy/clean/ms_after", study=None)
    folder = tmp_path / "runs/toy/clean/ms_after"
    files = ("model.pt", "test_embeddings.npz", "train_embeddings.npz", "history.csv", "run.json")

    outs = stage.run_from_arguments(params, chain)
    assert [str(o) for o in outs] == ["runs/toy/clean/ms_after/seed0", "runs/toy/clean/ms_after/seed1"]
    whole = {(seed, name): (folder / f"seed{seed}" / name).read_bytes() for seed in (0, 1) for name in files}
    assert not list((tmp_path / ".checkpoints").rglob("*.pt"))  # all removed once the stage is done

    shutil.rmtree(folder)
    trained, real_train = [], stage.train

    def killed_in_seed1(params, run, layout, **kwargs):
        if run.seed == 1:
            raise KeyboardInterrupt
        trained.append(run.seed)
        return real_train(params, run, layout, **kwargs)

    monkeypatch.setattr(stage, "train", killed_in_seed1)
    with pytest.raises(KeyboardInterrupt):
        stage.run_from_arguments(params, chain)
    monkeypatch.setattr(stage, "train", real_train)
    assert (tmp_path / ".checkpoints/toy/clean/ms_after/seed0/last.pt").is_file()  # kept: seed 1 was not written
    shutil.rmtree(folder)  # DVC empties the stage's output before running it again
    capsys.readouterr()
    stage.run_from_arguments(params, chain)
    assert "ms_after/seed0/last.pt after epoch 2 of 2" in capsys.readouterr().out  # seed 0: nothing left to train
    assert {(seed, name): (folder / f"seed{seed}" / name).read_bytes() for seed in (0, 1) for name in files} == whole
