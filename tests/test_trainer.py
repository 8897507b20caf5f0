import copy

import numpy as np
import pytest
import torch

from noisydml.config import ParamsError, load_params
from noisydml.data import glyphs
from noisydml.engine.trainer import ImageSet, RunSpec, Trainer, epoch_batches, steps_per_epoch

PARAMS = load_params("params.yaml")
from noisydml.pipeline.check import check_all  # noqa: E402

PARAMS = check_all(PARAMS)


@pytest.fixture(scope="module")
def data():
    images, labels, _ = glyphs.generate(12, 6, 16, seed=0)
    train, test = labels < 6, labels >= 6
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


def _spec(method="mcl", epochs=3, **train):
    cfg = copy.deepcopy(PARAMS["train"])
    cfg.update({"epochs": epochs, "batch": {"classes": 3, "per_class": 2}, "backbone_width": 4, "embedding_dim": 8, **train})
    hp = copy.deepcopy(PARAMS["methods"][method])
    if method == "mcl":
        hp["memory_size"] = 24
    return RunSpec(method, hp, cfg, seed=5, data_fingerprint="test")


def _fit(spec, data, ckpt, **kw):
    return Trainer(spec, *data, checkpoint_path=ckpt, runtime={**PARAMS["runtime"], "progress": False}, **kw).fit()


def test_batches_are_p_by_k_and_seeded():
    labels = np.repeat(np.arange(10), 5)
    a = epoch_batches(labels, per_class=2, batch_size=8, seed=1, epoch=0)
    assert all(len(b) == 8 for b in a) and len(a) == steps_per_epoch(len(labels), 8) == 6
    assert all(np.all(np.bincount(labels[b])[np.bincount(labels[b]) > 0] == 2) for b in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, epoch_batches(labels, 2, 8, seed=1, epoch=0)))
    assert not all(np.array_equal(x, y) for x, y in zip(a, epoch_batches(labels, 2, 8, seed=1, epoch=1)))


def test_killed_run_resumes_to_the_same_result(data, tmp_path):
    spec = _spec()
    whole = _fit(spec, data, tmp_path / "a.pt")
    with pytest.raises(KeyboardInterrupt):
        _fit(spec, data, tmp_path / "b.pt", stop_after_epoch=1)
    assert (tmp_path / "b.pt").is_file()
    resumed = _fit(spec, data, tmp_path / "b.pt")
    assert resumed.resumed_from_epoch == 1
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)


def test_checkpoint_of_another_config_is_ignored(data, tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        _fit(_spec(), data, tmp_path / "c.pt", stop_after_epoch=1)
    other = _fit(_spec(optimizer={"name": "adam", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.9}), data, tmp_path / "c.pt")
    assert other.resumed_from_epoch is None
    assert "belongs to a different configuration" in capsys.readouterr().out


def test_history_has_loss_and_monitoring(data, tmp_path):
    result = _fit(_spec("ms", epochs=3, eval_every=2), data, tmp_path / "d.pt")
    assert [h["epoch"] for h in result.history] == [1, 2, 3]
    assert all(np.isfinite(row["loss"]) for row in result.history)
    # monitored every eval_every epochs and at the last epoch
    assert [("test_precision_at_1" in row) for row in result.history] == [False, True, True]
    assert all(0 <= row["test_precision_at_1"] <= 1 for row in result.history[1:])
    assert result.test_embeddings.shape == (36, 8)
    assert torch.allclose(result.test_embeddings.norm(dim=1), torch.ones(36), atol=1e-5)


def test_too_many_classes_per_batch(data, tmp_path):
    spec = _spec("ms", batch={"classes": 10, "per_class": 2})
    with pytest.raises(ParamsError, match="train.batch.classes: 10 classes per batch, but the training labels have only 6"):
        _fit(spec, data, tmp_path / "e.pt")


def test_best_validation_selects_on_held_out_classes_only(data, tmp_path):
    train, test = data
    held = np.isin(train.labels, [4, 5])
    fit = ImageSet(train.images[~held], train.labels[~held])
    val = ImageSet(train.images[held], train.labels[held])
    spec = _spec(method="ms", epochs=4, eval_every=1, validation_classes=2, model_selection="best_validation")
    result = _fit(spec, (fit, test), tmp_path / "v.pt", val_set=val)
    scores = [h["val_precision_at_1"] for h in result.history]
    assert result.selected_epoch == 1 + int(np.argmax(scores))  # first best epoch
    # the returned model is the selected epoch's: its test P@1 is what was monitored at that epoch
    from noisydml.evaluation.retrieval import retrieval_metrics

    p1 = retrieval_metrics(result.test_embeddings, test.labels, recall_at=(1,), nmi=False)["precision_at_1"]
    assert p1 == pytest.approx(result.history[result.selected_epoch - 1]["test_precision_at_1"])
    last = _fit(_spec(method="ms", epochs=4, eval_every=1, validation_classes=2), (fit, test), tmp_path / "l.pt",
                val_set=val)
    assert last.selected_epoch == 4 and "val_precision_at_1" in last.history[0]


def test_best_validation_without_validation_classes_is_refused(raw_params):
    from noisydml.pipeline.check import validate_all as validate_params

    raw_params["train"]["model_selection"] = "best_validation"
    with pytest.raises(ParamsError, match="needs train.validation_classes > 0"):
        validate_params(raw_params)
    raw_params["train"]["validation_classes"] = 190
    with pytest.raises(ParamsError, match="leaves fewer than train.batch.classes"):
        validate_params(raw_params)
