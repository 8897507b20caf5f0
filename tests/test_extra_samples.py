"""The extension point ``Method.extra_samples``: a method asks for more rows per step (SGPS's authors forward K
positives per item), and the trainer loads and forwards them with the batch, in one pass with gradient."""

import copy

import numpy as np
import pytest
import torch

from noisydml.data import glyphs
from noisydml.engine import trainer as trainer_module  # builds the method
from noisydml.engine.types import ImageSet, RunSpec
from noisydml.methods.base import Method
from conftest import fit_job

from conftest import REPO

RUNTIME = {"device": "cpu", "threads": 1, "progress": False}


class PositivesPerAnchor(Method):
    """For each anchor, ``k`` other rows with its (training) label, drawn from a seeded RNG: the loss pulls each
    anchor towards their embeddings. Records what it asked for and what it got."""

    def __init__(self, setup, k=2, bad=None):
        super().__init__(setup)
        self.k, self.bad = k, bad
        self.asked, self.got = [], []
        self.by_label = {c: np.flatnonzero(setup.train_labels == c) for c in np.unique(setup.train_labels)}

    def extra_samples(self, rows, epoch, step):
        if self.bad is not None:
            return self.bad
        rng = np.random.default_rng([self.setup.seed, epoch, step])
        labels = self.setup.train_labels[rows]
        extra = np.concatenate([rng.choice(self.by_label[c], self.k) for c in labels])
        self.asked.append(extra)
        return extra

    def loss(self, batch):
        extra = batch.extra
        self.got.append((extra.index.cpu().numpy(), extra.labels.cpu().numpy(), extra.embeddings.requires_grad,
                         tuple(extra.embeddings.shape)))
        anchors = batch.embeddings.repeat_interleave(self.k, dim=0)
        return (1 - (anchors * extra.embeddings).sum(1)).mean(), {}


@pytest.fixture(scope="module")
def data():
    images, labels, _ = glyphs.generate(8, 6, 16, seed=0)
    train, test = labels < 4, labels >= 4
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


def _spec():
    from noisydml.config import load_params

    params = load_params(REPO / "params.yaml")
    cfg = copy.deepcopy(params["train"])
    cfg.update(epochs=2, batch={"classes": 2, "per_class": 2}, backbone_width=4, embedding_dim=8, pretrained="none",
               eval_every=1)
    return RunSpec("ms", params["methods"]["ms"], cfg, seed=3, data_fingerprint="test")


def _fit(monkeypatch, data, path, **method_kw):
    built = []

    def build(name, setup):
        built.append(PositivesPerAnchor(setup, **method_kw))
        return built[-1]

    monkeypatch.setattr(trainer_module, "build_method", build)
    result = fit_job(_spec(), *data, checkpoint_path=path, runtime=RUNTIME)
    return result, built[-1]


def test_the_rows_a_method_asks_for_reach_its_loss_with_gradient(monkeypatch, data, tmp_path):
    result, method = _fit(monkeypatch, data, tmp_path / "a.pt")
    assert len(method.got) == len(method.asked) > 0
    train_labels = data[0].labels
    for asked, (index, labels, grad, shape) in zip(method.asked, method.got):
        assert np.array_equal(index, asked) and np.array_equal(labels, train_labels[asked])
        assert grad and shape == (len(asked), 8)
    assert np.isfinite([h["loss"] for h in result.history]).all()
    # the loss on the extra rows trains the model: the anchors move towards their positives
    assert result.history[-1]["loss"] < result.history[0]["loss"]


def test_a_run_with_extra_rows_resumes_bit_exactly(monkeypatch, data, tmp_path):
    whole, _ = _fit(monkeypatch, data, tmp_path / "a.pt")
    monkeypatch.setattr(trainer_module, "build_method", lambda name, setup: PositivesPerAnchor(setup))
    with pytest.raises(KeyboardInterrupt):
        fit_job(_spec(), *data, checkpoint_path=tmp_path / "b.pt", runtime=RUNTIME, stop_after_epoch=1)
    resumed, _ = _fit(monkeypatch, data, tmp_path / "b.pt")
    assert resumed.resumed_from_epoch == 1
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)


@pytest.mark.parametrize("bad, message", [(np.array([0, 10_000]), "outside the training table"),
                                           (np.array([[0, 1]]), "1-D array of row indices"),
                                           (np.array([0.5]), "1-D array of row indices")])
def test_a_bad_request_names_the_method_and_the_problem(monkeypatch, data, tmp_path, bad, message):
    with pytest.raises(ValueError, match=f"ms.extra_samples\\(\\): .*{message}"):
        _fit(monkeypatch, data, tmp_path / "c.pt", bad=bad)


def _sgps_spec(authors=False):
    from noisydml.config import load_params

    spec = _spec()
    hp = copy.deepcopy(load_params(REPO / "params.yaml")["methods"]["sgps"])
    hp.update(positive_source="forward", memory_size=32, positives_per_sample=2)
    hp["authors"] = {key: authors for key in hp["authors"]}
    hp["sgm"].update(start_epoch=1)
    return RunSpec("sgps", hp, {**spec.train, "epochs": 3}, seed=3, data_fingerprint="test")


@pytest.mark.parametrize("authors", [False, True], ids=["paper_loop", "authors_loop"])
def test_sgps_forwards_its_positives_through_the_trainer_and_resumes_bit_exactly(data, tmp_path, authors):
    """The real method behind the extension point: from SGM's first round (epoch 1) every step forwards K
    positives per item, and L_noise trains on their embeddings; a killed run resumes bit-exactly. With every
    authors' option on too (second selection into the shared window, second clean loss, positives into the bank)."""
    whole = fit_job(_sgps_spec(authors), *data, checkpoint_path=tmp_path / "a.pt", runtime=RUNTIME)
    noise = [h["sgps_noise_batch"] for h in whole.history]
    assert noise[0] == 0.0 and max(noise[1:]) > 0  # no positives before SGM; L_noise once it ran
    if authors:
        assert max(h["sgps_clean_all"] for h in whole.history[1:]) > 0
    with pytest.raises(KeyboardInterrupt):
        fit_job(_sgps_spec(authors), *data, checkpoint_path=tmp_path / "b.pt", runtime=RUNTIME, stop_after_epoch=2)
    resumed = fit_job(_sgps_spec(authors), *data, checkpoint_path=tmp_path / "b.pt", runtime=RUNTIME)
    assert resumed.resumed_from_epoch == 2
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)


def test_sgps_without_l_noise_trains_prisms_model_bit_for_bit(data, tmp_path):
    """gamma_1 = gamma_2 = 0 (the ablation "L_noise off, selection only"): SGPS's bank, SGM and drawn positives
    change nothing the model sees, so it is PRISM, bit for bit (docs/ablations.md uses PRISM's runs for that row)."""
    from noisydml.config import load_params

    sgps = _sgps_spec()
    hp = copy.deepcopy(sgps.method_hparams)
    hp.update(gamma_batch=0.0, gamma_bank=0.0, positive_source="bank")
    without = fit_job(RunSpec("sgps", hp, sgps.train, seed=3, data_fingerprint="test"), *data,
                      checkpoint_path=tmp_path / "s.pt", runtime=RUNTIME)
    prism = copy.deepcopy(load_params(REPO / "params.yaml")["methods"]["prism"])
    prism.update({k: hp[k] for k in prism if k in hp})  # the selector's and the clean loss's settings, as SGPS's
    plain = fit_job(RunSpec("prism", prism, sgps.train, seed=3, data_fingerprint="test"), *data,
                    checkpoint_path=tmp_path / "p.pt", runtime=RUNTIME)
    assert max(h.get("sgm_subgroups", 0) for h in without.history) > 0  # SGM ran
    assert torch.equal(without.test_embeddings, plain.test_embeddings)
