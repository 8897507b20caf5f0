"""The lazy image pipeline (issue 13, item 1) and datasets' explicit splits (item 2's common part).

File-stored datasets are decoded per batch with the papers' transforms; augmentation is seeded per
(seed, epoch, sample), so a resumed run, or one with more loader workers, replays the same crops.
"""

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from noisydml.config import load_params
from noisydml.data import DatasetError
from noisydml.data.images import ImageFiles, InputPipeline, InputTransform, images_to_tensor, worker_shares
from noisydml.data.prepared import PreparedDataset, class_order
from noisydml.data.registry import prepare_dataset
from noisydml.engine.types import ImageSet, RunSpec
from noisydml.tools.check import check_all
from conftest import fit_job

PARAMS = check_all(load_params("params.yaml"))


def _photo(path, seed, size=(224, 224)):
    """A 'photo': smooth colour gradients plus noise, so crops and flips change the pixels."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = rng.uniform(0, 255, 3)
    img = (base + 0.6 * xx[..., None] * rng.uniform(-1, 1, 3) + 0.4 * yy[..., None] * rng.uniform(-1, 1, 3)
           + rng.normal(0, 12, (h, w, 3)))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)


def _csv_dataset(root, classes=(1, 2, 10, 11), per_class=6, split=None, size=(224, 224)):
    rows = []
    for c in classes:
        for i in range(per_class):
            rel = f"images/{c:03d}/{i}.jpg"
            _photo(root / rel, seed=1000 * c + i, size=size)
            row = {"path": rel, "label": str(c)}
            if split is not None:
                row["split"] = split(c, i)
            rows.append(row)
    pd.DataFrame(rows).to_csv(root / "list.csv", index=False)


def _folder_cfg(**over):
    raw = yaml.safe_load(open("params.yaml"))
    cfg = {"kind": "folder", "root": "", "csv": "list.csv", "storage": "files", "image_size": 64, "channels": 3,
           **over}
    from noisydml.data.registry import check_dataset

    return check_dataset({"datasets": {"mine": cfg}, **{k: v for k, v in raw.items() if k != "datasets"}}, "mine")


def test_numeric_class_names_sort_numerically():
    assert class_order(["10", "9", "1", "22634", "2"]) == ["1", "2", "9", "10", "22634"]
    assert class_order(["b", "a10", "a9"]) == ["a10", "a9", "b"]


def test_files_storage_writes_paths_sizes_hashes_and_the_given_split(tmp_path):
    # SOP-style numeric labels, split by the official lists (here: the csv's split column), not by text order
    official = {1: "train", 2: "test", 10: "train", 11: "test"}
    _csv_dataset(tmp_path, split=lambda c, i: official[c], size=(60, 40))
    info = prepare_dataset("mine", _folder_cfg(), tmp_path / "prepared", base_dir=tmp_path, workers=2)
    ds = PreparedDataset.load(tmp_path / "prepared", base_dir=tmp_path)
    assert ds.stored_as_files and isinstance(ds.images, ImageFiles)
    assert info["num_train_classes"] == 2 and info["num_test_classes"] == 2 and info["num_samples"] == 24
    assert list(ds.manifest.groupby("label")["class_name"].first()) == ["1", "2", "10", "11"]
    assert set(ds.split("train")["class_name"]) == {"1", "10"}
    assert (ds.manifest["width"] == 60).all() and (ds.manifest["height"] == 40).all()
    row = ds.manifest.iloc[7]
    import hashlib

    assert row["sha256"] == hashlib.sha256((tmp_path / row["path"]).read_bytes()).hexdigest()
    assert not (tmp_path / "prepared" / "images.npy").exists()
    # the fingerprint runs take follows the files' content
    (tmp_path / row["path"]).write_bytes((tmp_path / ds.manifest.iloc[8]["path"]).read_bytes())
    again = prepare_dataset("mine", _folder_cfg(), tmp_path / "prepared2", base_dir=tmp_path, workers=1)
    assert again["images_sha256"] != info["images_sha256"]


def test_split_errors_are_clear(tmp_path):
    _csv_dataset(tmp_path, split=lambda c, i: "train" if i < 3 else "test", size=(32, 32))
    with pytest.raises(DatasetError, match="both the training and the evaluation split"):
        prepare_dataset("mine", _folder_cfg(), tmp_path / "p", base_dir=tmp_path, workers=1)
    table = pd.read_csv(tmp_path / "list.csv")
    table["split"] = "validation"
    table.to_csv(tmp_path / "list.csv", index=False)
    with pytest.raises(DatasetError, match="split is 'validation'; allowed: train, test, query, gallery"):
        prepare_dataset("mine", _folder_cfg(), tmp_path / "p", base_dir=tmp_path, workers=1)


def test_a_broken_image_stops_prepare_naming_it(tmp_path):
    _csv_dataset(tmp_path, size=(32, 32))
    (tmp_path / "images/002/3.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match=r"cannot read image .*002/3.jpg"):
        prepare_dataset("mine", _folder_cfg(), tmp_path / "p", base_dir=tmp_path, workers=1)


def _files(tmp_path, n_classes=4, per_class=6):
    _csv_dataset(tmp_path, classes=tuple(range(1, n_classes + 1)), per_class=per_class)
    table = pd.read_csv(tmp_path / "list.csv")
    return ImageFiles([str(tmp_path / p) for p in table["path"]], np.arange(len(table))), table["label"].to_numpy() - 1


def test_training_inputs_are_augmented_and_seeded_per_sample(tmp_path):
    files, _ = _files(tmp_path, n_classes=2, per_class=3)
    pipe = InputPipeline(InputTransform(crop=64, resize=72), seed=3)
    batches = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    e0 = torch.cat(list(pipe.train_batches(files, batches, epoch=0)))
    e1 = torch.cat(list(pipe.train_batches(files, batches, epoch=1)))
    assert e0.shape == (6, 3, 64, 64)
    assert not torch.equal(e0, e1)  # new crops every epoch
    # a sample's crop does not depend on its batch, its position or the loader's workers
    regrouped = torch.cat(list(InputPipeline(InputTransform(crop=64, resize=72), seed=3, workers=2)
                               .train_batches(files, [np.array([5, 0]), np.array([4, 1, 3, 2])], epoch=0)))
    assert torch.equal(regrouped, e0[[5, 0, 4, 1, 3, 2]])
    # workers persist across passes; an extra batch fetched while a training pass is under way (a method's extra
    # rows) takes its own loader; eval passes go on after both; each batch split over the workers comes back whole
    pooled = InputPipeline(InputTransform(crop=64, resize=72), seed=3, workers=2)
    for _ in range(2):
        train = pooled.train_batches(files, batches, epoch=0)
        first = next(train)
        extra = next(iter(pooled.train_batches(files, [np.array([2, 4, 1])], epoch=1, purpose="extra")))
        assert torch.equal(torch.cat([first, next(train)]), e0)
        assert torch.equal(extra, e1[[2, 4, 1]])
    assert torch.equal(torch.cat(list(pooled.eval_batches(files, 4))), torch.cat(list(pipe.eval_batches(files, 4))))
    assert [len(s) for s in worker_shares(list(range(7)), 3)] == [2, 3, 2] and worker_shares([0], 4) == [[0]]
    # the caller's RNG stream is untouched
    torch.manual_seed(0)
    list(pipe.train_batches(files, batches, epoch=0))
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(1))
    # evaluation: Resize + CenterCrop, deterministic, normalised with the transform's statistics
    ev = torch.cat(list(pipe.eval_batches(files, batch_size=4)))
    assert torch.equal(ev, torch.cat(list(pipe.eval_batches(files, batch_size=5))))
    assert ev.shape == (6, 3, 64, 64)
    unit = torch.cat(list(InputPipeline(InputTransform(crop=64, resize=72, mean=(0.5,) * 3, std=(0.5,) * 3))
                          .eval_batches(files, 6)))
    assert unit.min() >= -1.0 and unit.max() <= 1.0 and not torch.equal(unit, ev)


def test_arrays_are_fed_as_before():
    images = np.random.default_rng(0).integers(0, 256, (10, 8, 8, 1), dtype=np.uint8)
    pipe = InputPipeline()
    whole = images_to_tensor(images)
    got = list(pipe.train_batches(images, [np.array([3, 1]), np.array([9])], epoch=4))
    assert torch.equal(got[0], whole[[3, 1]]) and torch.equal(got[1], whole[[9]])
    assert torch.equal(torch.cat(list(pipe.eval_batches(images, 4))), whole)


def _spec(epochs=3):
    cfg = copy.deepcopy(PARAMS["train"])
    cfg.update({"epochs": epochs, "batch": {"classes": 2, "per_class": 2}, "backbone_width": 4, "embedding_dim": 8,
                "pretrained": "none", "eval_every": 1})
    assert (cfg["input"]["crop"], cfg["input"]["resize"], cfg["input"]["augment"]) == (224, 256, True)  # the papers'
    return RunSpec("ms", copy.deepcopy(PARAMS["methods"]["ms"]), cfg, seed=2, data_fingerprint="files-test")


def test_a_lazily_loaded_run_resumes_bit_exactly_with_augmentation(tmp_path):
    """The done-when item: 224x224 RGB files, augmentation on, killed after epoch 1 and resumed."""
    files, labels = _files(tmp_path / "data", n_classes=4, per_class=6)
    train_rows, test_rows = labels < 2, labels >= 2
    train = ImageSet(files[np.flatnonzero(train_rows)], labels[train_rows])
    test = ImageSet(files[np.flatnonzero(test_rows)], labels[test_rows])
    runtime = {**PARAMS["runtime"], "progress": False, "threads": 1}
    whole = fit_job(_spec(), train, test, tmp_path / "a.pt", runtime=runtime)
    with pytest.raises(KeyboardInterrupt):
        fit_job(_spec(), train, test, tmp_path / "b.pt", runtime=runtime, stop_after_epoch=1)
    resumed = fit_job(_spec(), train, test, tmp_path / "b.pt", runtime={**runtime, "loader_workers": 2})
    assert resumed.resumed_from_epoch == 1
    assert torch.equal(whole.test_embeddings, resumed.test_embeddings)
    assert torch.equal(whole.train_embeddings, resumed.train_embeddings)
    assert [r["loss"] for r in whole.history] == [r["loss"] for r in resumed.history]
    assert whole.test_embeddings.shape == (12, 8)


def test_query_gallery_metrics_search_queries_against_the_gallery():
    from noisydml.evaluation.retrieval import neighbours_used, retrieval_metrics

    # 2 classes on two axes; queries 0..3, gallery 4..9. Query 3 (class 1) lies nearest a class-0 gallery item.
    emb = np.array([[1, 0.1], [1, -0.1], [0.1, 1], [0.9, 0.5],
                    [1, 0], [0.95, 0.3], [0.2, 1], [0, 1], [-0.1, 1], [0.3, 0.95]], np.float32)
    labels = np.array([0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    query = np.arange(10) < 4
    m = retrieval_metrics(emb, labels, recall_at=(1, 2), nmi=False, query_mask=query)
    assert m["precision_at_1"] == 0.75 and m["recall_at_1"] == 0.75
    # R = the query's class size in the gallery (2 for class 0, 4 for class 1), not class size - 1
    assert neighbours_used(labels, (1,), 1023, query) == (4, True)
    assert neighbours_used(labels, (1,), 1023) == (5, True)
    # query = gallery (the default) differs: each row searches all the others
    assert retrieval_metrics(emb, labels, recall_at=(1,), nmi=False)["precision_at_1"] != m["precision_at_1"]
    with pytest.raises(ValueError, match="needs both"):
        retrieval_metrics(emb, labels, nmi=False, query_mask=np.ones(10, bool))


def test_a_files_dataset_with_a_query_gallery_split_trains_and_evaluates_end_to_end(tmp_path, raw_params,
                                                                                     monkeypatch):
    """prepare (files) -> corrupt -> train -> evaluate, In-Shop's layout: train classes, query/gallery classes."""
    from noisydml.tools.check import validate_all
    from noisydml.pipeline.corrupt import corrupt
    from noisydml.pipeline.evaluate import evaluate_run
    from noisydml.pipeline.layout import Layout
    from noisydml.pipeline.prepare import prepare
    from noisydml.pipeline.train import train
    from noisydml.runs import find_runs, runs_of

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    classes = tuple(range(1, 9))
    _csv_dataset(tmp_path, classes=classes, per_class=6, size=(48, 40),
                 split=lambda c, i: "train" if c <= 4 else ("query" if i < 2 else "gallery"))
    raw = raw_params
    raw["datasets"] = {"shop": {"kind": "folder", "csv": "list.csv", "storage": "files"}}
    raw["grid"].update(datasets=["shop"], noises=["sym50"], methods=["ms"], seeds=[0], run_noises=[])
    raw["chains"], raw["noise_runs"] = {}, {}
    raw["timing"]["dataset"] = "shop"
    raw["train"].update(epochs=2, batch={"classes": 2, "per_class": 2}, backbone_width=4, embedding_dim=8,
                        eval_every=1)
    raw["train"]["input"].update(crop=32, resize=36)
    raw["runtime"].update(progress=False, loader_workers=1, prepare_workers=2)
    params = validate_all(raw)
    layout = Layout(tmp_path)
    info = prepare(params, "shop", layout)
    assert (info["num_train_samples"], info["num_query_samples"], info["num_gallery_samples"]) == (24, 8, 16)
    corrupt(params, "shop", "sym50", layout)
    run = train(params, *find_runs(runs_of(params), "runs/shop/sym50/ms/seed0", "params"), layout)
    saved = np.load(run / "test_embeddings.npz")
    assert saved["query_mask"].sum() == 8 and len(saved["labels"]) == 24
    result = evaluate_run(params, "shop", "sym50", "ms", 0, layout)
    assert result["num_queries"] == 8 and result["num_gallery"] == 16 and result["k_used"] >= 4
    assert 0.0 <= result["metrics"]["precision_at_1"] <= 1.0
    assert result["training"]["curve_test_precision_at_1"][-1] == pytest.approx(result["metrics"]["precision_at_1"])
