"""The noisy-label classification baselines (PRISM's and SGPS's tables): their rules on hand-made cases, and the
trainer pieces they need (a second network, retrieval on the features, an epoch the method picks)."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import batch_of
from noisydml.config import ParamsError, load_params
from noisydml.data import glyphs
from noisydml.engine.judge import GroundTruth
from noisydml.engine.types import ImageSet, RunSpec
from noisydml.methods import build_method
from noisydml.methods.base import MethodSetup
from noisydml.methods.f_correction import estimate_transition, forward_corrected_loss
from noisydml.methods.labelwave import LabelWaveSelector
from noisydml.methods.parts.coteaching import forget_share, small_loss_rows
from noisydml.tools.check import check_all
from conftest import FakeServices, fit_job

PARAMS = check_all(load_params("params.yaml"))


# ---------------------------------------------------------------------------------------------- Co-teaching family

class _Identity(torch.nn.Module):
    """A 'network' whose features are given per test (the peer's), with the attributes a peer needs."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Identity()
        self.head = torch.nn.Linear(4, 4)


#: the Co-teaching methods' services: their peer networks are the identity, their outputs the batch's (_batch)
PEER_SERVICES = FakeServices(_Identity)


def _coteaching(name, **hparams):
    """A Co-teaching method whose two classifiers are the identity: logits = the features given."""
    labels = np.repeat(np.arange(4), 4)
    hp = {**PARAMS["methods"][name], **hparams}
    method = build_method(name, MethodSetup(hp, 4, 4, len(labels), labels, seed=0, feature_dim=4,
                                            services=PEER_SERVICES))
    for classifier in (method.classifier, method.peer.classifier):
        with torch.no_grad():
            classifier.layer.weight.copy_(torch.eye(4))
            classifier.layer.bias.zero_()
    return method


def _batch(logits_f, logits_g, labels, epoch=0):
    features = logits_f.clone().requires_grad_()
    peer = logits_g.clone().requires_grad_()
    batch = batch_of(F.normalize(torch.randn(len(labels), 4), dim=1), labels, epoch=epoch, features=features)
    PEER_SERVICES.forward_with = lambda net: (peer, peer)
    return batch, features, peer


def test_the_forget_schedule_grows_to_tau_over_t_k_epochs():
    assert [forget_share(e, 0.5, 4) for e in range(6)] == [0.0, 0.125, 0.25, 0.375, 0.5, 0.5]
    assert forget_share(0, 0.3, 0) == 0.3
    assert small_loss_rows(torch.tensor([3.0, 1.0, 2.0, 0.5]), 0.5).tolist() == [3, 1]
    assert small_loss_rows(torch.tensor([3.0, 1.0]), 0.1).tolist() == [1]  # at least one


def test_coteaching_updates_each_network_on_exactly_the_peers_small_loss_samples():
    torch.manual_seed(0)
    method = _coteaching("coteaching", forget_rate=0.5, forget_epochs=2)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    logits_f, logits_g = torch.randn(8, 4) * 3, torch.randn(8, 4) * 3
    loss_f = F.cross_entropy(logits_f, labels, reduction="none")
    loss_g = F.cross_entropy(logits_g, labels, reduction="none")

    class Ctx:
        epoch = 1  # forget share tau * 1 / 2 = 0.25: 6 of 8 kept

    method.on_epoch_start(Ctx())
    batch, features, peer = _batch(logits_f, logits_g, labels, epoch=1)
    loss, logs = method.loss(batch)
    by_f = set(torch.argsort(loss_f)[:6].tolist())
    by_g = set(torch.argsort(loss_g)[:6].tolist())
    expected = loss_f[sorted(by_g)].mean() + loss_g[sorted(by_f)].mean()
    assert loss.item() == pytest.approx(expected.item())
    loss.backward()
    # f's gradient only where g chose (the exchange), g's only where f chose
    assert {i for i in range(8) if features.grad[i].abs().sum() > 0} == by_g
    assert {i for i in range(8) if peer.grad[i].abs().sum() > 0} == by_f
    decisions = method.decisions()
    assert np.array_equal(decisions.keep[:8], [1.0 if i in by_g else 0.0 for i in range(8)])
    assert np.isnan(decisions.keep[8:]).all() and decisions.visits[:8].tolist() == [1.0] * 8


def test_coteaching_plus_exchanges_only_where_the_networks_disagree():
    method = _coteaching("coteaching_plus", forget_rate=0.0, disagreement_from_epoch=1)
    labels = torch.tensor([0, 1, 2, 3])
    logits_f = torch.eye(4) * 5  # predicts 0, 1, 2, 3
    logits_g = torch.eye(4)[[0, 2, 2, 0]] * 5  # predicts 0, 2, 2, 0: disagrees on rows 1 and 3

    class Ctx:
        epoch = 1

    method.on_epoch_start(Ctx())
    batch, features, peer = _batch(logits_f, logits_g, labels, epoch=1)
    loss, _ = method.loss(batch)
    loss.backward()
    assert {i for i in range(4) if features.grad[i].abs().sum() > 0} == {1, 3}
    assert {i for i in range(4) if peer.grad[i].abs().sum() > 0} == {1, 3}
    # before disagreement_from_epoch it is plain Co-teaching: every row teaches
    batch, features, _ = _batch(logits_f, logits_g, labels, epoch=0)
    method.loss(batch)[0].backward()
    assert (features.grad.abs().sum(1) > 0).all()
    # nothing disagrees: a zero loss that still backpropagates
    batch, features, _ = _batch(logits_f, logits_f, labels, epoch=1)
    loss, logs = method.loss(batch)
    assert loss.item() == 0.0 and logs["coteaching_exchanged"] == 0.0
    loss.backward()


def test_coteaching_w_t_classifies_with_the_normalised_softmax():
    method = build_method("coteaching_t", MethodSetup(PARAMS["methods"]["coteaching_t"], 4, 4, 8,
                                                      np.repeat(np.arange(4), 2), seed=0, feature_dim=6,
                                                      services=FakeServices(_Identity)))
    features = torch.randn(3, 6)
    cosine = F.normalize(features, dim=1) @ F.normalize(method.classifier.layer.weight, dim=1).T
    assert torch.allclose(method.classifier(features), cosine / 0.05)
    assert method.classifier.layer.bias is None


# ---------------------------------------------------------------------------------------------- F-correction

def _symmetric(c, rate):
    return torch.full((c, c), rate / (c - 1)) * (1 - torch.eye(c)) + torch.eye(c) * (1 - rate)


def test_forward_correction_with_the_true_transition_recovers_the_clean_label_minimiser():
    """Trained on labels drawn from T[y] (50% symmetric noise, clean class 2 of 4), the corrected risk is minimised
    by the clean posterior (p_2 -> 1); plain cross-entropy by the noisy one (p_2 -> 0.5)."""
    transition = _symmetric(4, 0.5)
    noisy = transition[2]  # the distribution of the observed label when the clean one is 2

    def fit(corrected):
        logits = torch.zeros(1, 4, requires_grad=True)
        optimiser = torch.optim.Adam([logits], lr=0.1)
        for _ in range(2000):
            losses = torch.stack([forward_corrected_loss(logits, torch.tensor([j]), transition) if corrected
                                  else F.cross_entropy(logits, torch.tensor([j])) for j in range(4)])
            optimiser.zero_grad()
            (noisy @ losses).backward()  # the expected loss over the noisy label
            optimiser.step()
        return F.softmax(logits, dim=1)[0].detach()

    assert fit(corrected=True)[2] > 0.97
    assert fit(corrected=False)[2] == pytest.approx(0.5, abs=0.02)


def test_the_transition_estimate_reads_each_classs_anchor():
    transition = _symmetric(3, 0.3)
    # three perfect anchors (their outputs are T's rows) among less confident samples
    others = torch.tensor([[0.4, 0.3, 0.3], [0.3, 0.4, 0.3], [0.3, 0.3, 0.4]])
    probabilities = torch.cat([others, transition, others])
    assert torch.allclose(estimate_transition(probabilities), transition)
    # the authors' filter: the top of each column is an outlier; the anchor is the next
    outlier = torch.tensor([[0.99, 0.005, 0.005], [0.005, 0.99, 0.005], [0.005, 0.005, 0.99]])
    estimate = estimate_transition(torch.cat([probabilities, outlier]), quantile=0.95)
    assert torch.allclose(estimate, transition)


# ---------------------------------------------------------------------------------------------- LabelWave

def test_labelwave_selects_the_first_minimum_of_the_smoothed_prediction_changes():
    selector = LabelWaveSelector(window=1, patience=2)
    curve = [None, 50, 40, 30, 35, 45, 20, 10]  # epoch 1 has no previous predictions; the late dip is ignored
    scores = [selector.update(c) for c in curve]
    assert scores == [None, -50, -40, -30, -35, -45, None, None]
    best = max(s for s in scores if s is not None)
    assert scores.index(best) + 1 == 4 and selector.final  # the trainer reports epoch 4's model
    smooth = LabelWaveSelector(window=2, patience=1)
    assert [smooth.update(c) for c in [10, 6, 12, 2]] == [-10, -8, -9, None]  # smoothed 10, 8, 9: final


# ---------------------------------------------------------------------------------------------- in the trainer

@pytest.fixture(scope="module")
def data():
    images, labels, _ = glyphs.generate(12, 6, 16, seed=0)
    train, test = labels < 6, labels >= 6
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


def _spec(method, epochs=3, hparams=None, **train):
    cfg = copy.deepcopy(PARAMS["train"])
    cfg.update({"epochs": epochs, "batch": {"classes": 3, "per_class": 2}, "backbone_width": 4, "embedding_dim": 8,
                **train})
    hp = {**copy.deepcopy(PARAMS["methods"][method]), **(hparams or {})}
    return RunSpec(method, hp, cfg, seed=5, data_fingerprint="test")


def _fit(spec, data, ckpt, **kw):
    return fit_job(spec, *data, checkpoint_path=ckpt, runtime={**PARAMS["runtime"], "progress": False}, **kw)


def _noisy_truth(train):
    """Ground truth with every third training row flagged noisy (what the trainer scores decisions against)."""
    noisy = np.zeros(len(train.labels), bool)
    noisy[::3] = True
    return GroundTruth(noisy, train.labels.copy(), np.ones(len(noisy), bool))


def _whole_and_resumed(spec, data, tmp_path, stop_after):
    """The run uninterrupted, and the same run killed after ``stop_after`` epochs and resumed: both judged."""
    truth = _noisy_truth(data[0])
    whole = _fit(spec, data, tmp_path / "a.pt", truth=truth)
    with pytest.raises(KeyboardInterrupt):
        _fit(spec, data, tmp_path / "b.pt", truth=truth, stop_after_epoch=stop_after)
    resumed = _fit(spec, data, tmp_path / "b.pt", truth=truth)
    assert resumed.resumed_from_epoch == stop_after and resumed.history == whole.history
    assert torch.equal(resumed.test_embeddings, whole.test_embeddings)
    return whole, resumed


def test_a_two_network_method_resumes_bit_exactly_and_is_judged(data, tmp_path):
    whole, resumed = _whole_and_resumed(_spec("coteaching_plus", epochs=4, hparams={"forget_epochs": 2}), data,
                                        tmp_path, stop_after=2)
    for key, value in whole.method.state_dict().items():
        assert torch.equal(value, resumed.method.state_dict()[key]), key
    # the peer trained (it moved from its start) and differs from the reported network
    peer = whole.method.peer.network.backbone.state_dict()
    assert any(not torch.equal(v, whole.model.backbone.state_dict()[k]) for k, v in peer.items())
    assert {"diag_selection_precision", "diag_selection_recall"} <= set(whole.history[-1])
    assert whole.history[-1]["coteaching_forget_share"] == 0.5


def test_classification_baselines_retrieve_with_the_normalised_features(data, tmp_path):
    result = _fit(_spec("cross_entropy", epochs=1), data, tmp_path / "c.pt")
    width = result.model.backbone.out_dim
    assert result.test_embeddings.shape[1] == width != 8  # the backbone's features, not the 8-d head
    assert torch.allclose(result.test_embeddings.norm(dim=1), torch.ones(len(result.test_embeddings)))
    # the head is not trained: it feeds nothing the method uses
    assert all(not p.requires_grad for p in result.model.head.parameters())


def test_f_correction_estimates_after_its_epochs_and_refuses_a_budget_without_correction(data, tmp_path):
    result = _fit(_spec("f_correction", epochs=3, hparams={"estimate_after_epochs": 2}), data, tmp_path / "f.pt")
    assert "fcorrection_transition_diagonal" in result.history[2] and bool(result.method.estimated)
    assert not torch.equal(result.method.transition, torch.eye(len(result.method.transition)))
    with pytest.raises(ParamsError, match="estimate_after_epochs: 3 .* allowed: 1..2"):
        _fit(_spec("f_correction", epochs=3, hparams={"estimate_after_epochs": 3}), data, tmp_path / "g.pt")


def test_labelwave_reports_the_epoch_it_picked_without_validation_data(data, tmp_path):
    spec = _spec("labelwave", epochs=5, hparams={"window": 1, "patience": 1})
    result = _fit(spec, data, tmp_path / "l.pt")
    scored = [(row["selection_score"], -row["epoch"]) for row in result.history if "selection_score" in row]
    assert scored and result.selected_epoch == -max(scored)[1]
    assert "selection_score" not in result.history[0]  # no previous predictions after the first epoch
    with pytest.raises(ParamsError, match="train.model_selection: 'best_validation'.*allowed: last"):
        _fit(_spec("labelwave", model_selection="best_validation", validation_classes=2), data, tmp_path / "m.pt",
             val_set=data[1])


# ---------------------------------------------------------------------------------------------- DivideMix, UNICON

def test_the_gmm_splits_a_bimodal_loss_at_its_valley():
    from noisydml.methods.parts.semisupervised import gmm_clean_probability

    rng = np.random.default_rng(0)
    clean, noisy = rng.normal(0.2, 0.05, 300), rng.normal(2.0, 0.3, 200)
    w = gmm_clean_probability(np.concatenate([clean, noisy]), seed=0)
    assert (w[:300] > 0.5).mean() > 0.99 and (w[300:] < 0.5).mean() > 0.99
    assert np.array_equal(w, gmm_clean_probability(np.concatenate([clean, noisy]), seed=0))  # seeded


def test_mixmatch_pieces_sharpen_mix_and_penalise_as_the_equations_say():
    from noisydml.methods.parts.semisupervised import (augment, generator, mix, mixing_weight, mixmatch_losses,
                                                       sharpen)

    p = torch.tensor([[0.6, 0.4]])
    assert torch.allclose(sharpen(p, 0.5), torch.tensor([[0.36, 0.16]]) / 0.52)
    weights = [mixing_weight(4.0, generator(0, i)) for i in range(50)]
    assert all(0.5 <= w <= 1.0 for w in weights) and weights == [mixing_weight(4.0, generator(0, i)) for i in range(50)]
    x = torch.arange(6.0).view(3, 2)
    assert torch.equal(mix(x, torch.tensor([2, 0, 1]), 0.75), 0.75 * x + 0.25 * x[[2, 0, 1]])
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    targets = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    labelled = torch.tensor([True, True, False])
    loss_x, loss_u, penalty = mixmatch_losses(logits, targets, labelled)
    log_p = F.log_softmax(logits, 1)
    assert loss_x.item() == pytest.approx(-(targets[:2] * log_p[:2]).sum(1).mean().item())
    assert loss_u.item() == pytest.approx(((log_p[2].exp() - targets[2]) ** 2).mean().item())
    mean = log_p.exp().mean(0)
    assert penalty.item() == pytest.approx((0.5 * torch.log(0.5 / mean)).sum().item())
    images = torch.randn(5, 1, 8, 8)
    a, b = augment(images, generator(1, 2), 2, True), augment(images, generator(1, 2), 2, True)
    assert torch.equal(a, b) and a.shape == images.shape and not torch.equal(a, images)


def test_unicon_selects_the_same_share_of_every_class():
    from noisydml.methods.unicon import selection_ratio, uniform_selection

    labels = torch.tensor([0] * 10 + [1] * 4)
    divergence = torch.cat([torch.linspace(0, 0.9, 10), torch.tensor([0.8, 0.1, 0.9, 0.2])])
    labelled = uniform_selection(divergence, labels, 0.5)
    assert labelled[:10].sum() == 5 and labelled[:5].all()  # the 5 lowest of class 0
    assert labelled[10:].tolist() == [False, True, False, True]  # the 2 lowest of class 1
    assert selection_ratio(torch.tensor([0.1, 0.2, 0.3, 0.4]), d_u=0.7, tau=5) == 0.5
    # a mean above d_u lowers the threshold towards the minimum: (0.8 + 0.9 + 0.95) / 3 -> mean - (mean - 0.8) / 5
    assert selection_ratio(torch.tensor([0.8, 0.9, 0.95]), d_u=0.7, tau=5) == pytest.approx(1 / 3)


@pytest.mark.parametrize("method", ["dividemix", "unicon"])
def test_co_divide_methods_divide_mix_resume_bit_exactly_and_are_judged(data, tmp_path, method):
    hparams = {"warmup_epochs": 1, "rampup_epochs": 1, "augment": {"pad": 2, "flip": True}}
    whole, _ = _whole_and_resumed(_spec(method, epochs=3, hparams=hparams), data, tmp_path, stop_after=2)
    last = whole.history[-1]
    assert {"diag_selection_precision", "diag_pseudo_label_accuracy", "diag_confidence_auroc"} <= set(last)
    assert last["lambda_u"] > 0 and "main_loss_u" in last and "codivide_labelled_main" in last
    if method == "unicon":
        assert "unicon_contrastive" in last and any(p.grad is not None for p in whole.model.head.parameters())


# ---------------------------------------------------------------------------------------------- LRA-Diffusion

def test_ddim_with_an_exact_denoiser_returns_the_label_it_was_built_for():
    from noisydml.methods.lra_diffusion import ddim_sample, noise_schedule

    alpha_bar = noise_schedule(1000)
    target = F.one_hot(torch.tensor([2, 0, 1]), 3).float()

    class Oracle(torch.nn.Module):  # ε of y_t given that y_0 = target
        out = torch.nn.Linear(1, 3)

        def forward(self, y, t, features):
            a = alpha_bar[t][:, None]
            return (y - a.sqrt() * target) / (1 - a).sqrt()

    class Oracle0(torch.nn.Module):  # y_0-prediction: the target itself
        out = torch.nn.Linear(1, 3)

        def forward(self, y, t, features):
            return target

    from noisydml.methods.parts.semisupervised import generator
    assert torch.allclose(ddim_sample(Oracle(), torch.zeros(3, 4), alpha_bar, 10, generator(0)), target, atol=1e-4)
    assert torch.allclose(ddim_sample(Oracle0(), torch.zeros(3, 4), alpha_bar, 10, generator(0), "y0"), target)


def test_lra_diffusion_retrieves_neighbours_labels_relabels_and_resumes_bit_exactly(data, tmp_path):
    train, _ = data
    spec = _spec("lra_diffusion", epochs=3, hparams={"neighbours": 3, "diffusion_steps": 50, "sample_steps": 5})
    whole, _ = _whole_and_resumed(spec, data, tmp_path, stop_after=1)
    retrieved = whole.method.neighbour_labels
    assert retrieved.shape == (len(train.labels), 3)
    assert not torch.equal(retrieved, torch.as_tensor(train.labels)[:, None].repeat(1, 3))  # neighbours' labels
    assert {"diag_pseudo_label_accuracy", "diag_confidence_auroc"} <= set(whole.history[-1])


# ---------------------------------------------------------------------------------------------- tables and report

def test_the_papers_classification_rows_name_our_methods():
    from pathlib import Path

    from noisydml.methods import method_names
    from noisydml.reporting.references import load_references

    refs = load_references(Path(__file__).resolve().parents[1] / "references" / "papers")
    rows = refs[refs["row"].str.startswith(("Co-teaching", "F-correction", "UNICON", "DivideMix", "LRA-Diffusion",
                                            "LabelWave"))]
    assert set(rows["method"]) == {"coteaching", "coteaching_plus", "coteaching_t", "f_correction", "unicon",
                                   "dividemix", "lra_diffusion", "labelwave"} <= set(method_names())
    assert len(rows[rows["paper"] == "PRISM"]) == 66 and len(rows[rows["paper"] == "SGPS"]) == 225
    # F-correction assumes closed-set noise: the papers report it under symmetric noise only
    assert set(rows[rows["method"] == "f_correction"]["noise"]) == {"symmetric"}


def test_the_study_compares_each_seed_with_cross_entropy_and_shows_labelwaves_epoch():
    from noisydml.studies.classification_baselines import comparison

    def row(method, seed, p1, **extra):
        return {"dataset": "glyphs", "noise": "sym50", "method": method, "seed": seed, "precision_at_1": p1,
                "mean_average_precision_at_r": p1 / 3, "selected_epoch": 12, **extra}

    per_seed = pd.DataFrame([row("cross_entropy", 0, 0.50), row("cross_entropy", 1, 0.52),
                             row("coteaching", 0, 0.55, final_diag_selection_precision=0.9),
                             row("coteaching", 1, 0.51, final_diag_selection_precision=0.8),
                             row("labelwave", 0, 0.49, selected_epoch=5,
                                 curve_test_precision_at_1=[None, None, 0.4, None, None, 0.45, None, None, 0.5]),
                             row("ms", 0, 0.6)])
    table = comparison(per_seed)
    assert list(table["method"]) == ["cross_entropy", "cross_entropy", "coteaching", "coteaching", "labelwave"]
    co = table[table["method"] == "coteaching"]
    assert co["P@1 - cross_entropy"].round(6).tolist() == [5.0, -1.0]
    assert co["selection precision"].tolist() == [0.9, 0.8]
    wave = table[table["method"] == "labelwave"].iloc[0]
    assert wave["epoch picked"] == 5 and wave["best test epoch (not used)"] == 9
    assert comparison(per_seed[per_seed["method"] == "ms"]).empty  # none of the family: an empty section
