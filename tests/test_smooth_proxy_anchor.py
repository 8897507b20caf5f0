"""Smooth Proxy-Anchor (issue 12): the loss, the frozen backbone, relabelling, the chained inputs, the judge."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import ProxyAnchorLoss

from noisydml.config import load_params
from noisydml.data import glyphs
from noisydml.engine.judge import GroundTruth, score_decisions
from noisydml.engine.types import ImageSet, RunSpec
from noisydml.methods import build_method, check_frozen_backbone
from noisydml.methods.base import Batch, Decisions, MethodSetup
from noisydml.methods.parts.smooth_proxy_anchor import (dense_confidences, relabel, smooth_proxy_anchor_loss,
                                                        smoothing)
from noisydml.models import build_model
from noisydml.tools.check import check_all
from noisydml.schema import ParamsError
from conftest import fit_job

PARAMS = check_all(load_params("params.yaml"))


def _hparams(name, **over):
    hp = copy.deepcopy(PARAMS["methods"][name])
    hp.update(over)
    return hp


def _one_hot_inputs(labels, k=1, num_classes=7):
    """Phase-1 exports in which every sample is certain of its given label (and of nothing else)."""
    n = len(labels)
    classes = np.stack([labels] + [(labels + j) % num_classes for j in range(1, k)], axis=1)
    values = np.zeros((n, k), np.float32)
    values[:, 0] = 1.0
    return {"confidence_classes": classes.astype(np.int64), "confidence_values": values,
            "confidence_label": labels.astype(np.int64)}


def _setup(labels, hparams, inputs=None, num_classes=7, dim=8, feature_dim=12):
    return MethodSetup(hparams=hparams, num_classes=num_classes, embedding_dim=dim, dataset_size=len(labels),
                       train_labels=labels, seed=3, feature_dim=feature_dim, sample_ids=np.arange(len(labels)),
                       inputs=inputs or {})


def _batch(labels, dim=8, seed=0, feature_dim=12):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(len(labels), dim, generator=g).requires_grad_(True)  # the head's output, before normalising
    return Batch(embeddings=F.normalize(raw, dim=1), features=torch.randn(len(labels), feature_dim, generator=g),
                 labels=torch.as_tensor(labels), index=torch.arange(len(labels)),
                 sample_id=torch.arange(len(labels)), step=0, epoch=0), raw


def test_one_hot_confidences_and_a_hard_step_give_pmls_proxy_anchor_loss():
    labels = np.array([0, 0, 1, 1, 2, 2, 4, 4, 6, 6])  # classes 3 and 5 have no positive in the batch
    method = build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss", hard=True),
                                                    _one_hot_inputs(labels, k=3)))
    reference = ProxyAnchorLoss(num_classes=7, embedding_size=8, margin=0.1, alpha=32.0)
    with torch.no_grad():
        reference.proxies.copy_(method.proxies)
    batch, raw = _batch(labels)
    ours, _ = method.loss(batch)
    theirs = reference(batch.embeddings, batch.labels)
    assert torch.allclose(ours, theirs, atol=1e-6), (ours, theirs)
    # gradients with respect to the head's output (pml normalises the embeddings again: only the tangential
    # part of the gradient with respect to the normalised ones agrees, and it is all that reaches the head)
    g_ours = torch.autograd.grad(ours, [raw, method.proxies], retain_graph=True)
    g_theirs = torch.autograd.grad(theirs, [raw, reference.proxies], retain_graph=True)
    for a, b in zip(g_ours, g_theirs):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_smooth_weights_enter_inside_the_log_sums():
    cos = torch.tensor([[0.9, 0.1], [0.2, 0.3], [0.5, -0.4]])
    conf = torch.tensor([[0.8, 0.1], [0.6, 0.7], [0.2, 0.3]])  # row 2 is positive for no proxy
    kw = dict(alpha=4.0, margin=0.1, tau=0.5, sharpness=10.0, position=0.5)
    loss, logs = smooth_proxy_anchor_loss(cos, conf, **kw)
    s = torch.sigmoid(10 * (conf - 0.5))
    pos = conf >= 0.5
    expected = 0.0
    for p in range(2):  # both proxies have a positive
        expected += torch.log1p((s[:, p] * torch.exp(-4 * (cos[:, p] - 0.1)))[pos[:, p]].sum()) / 2
        expected += torch.log1p(((1 - s[:, p]) * torch.exp(4 * (cos[:, p] + 0.1)))[~pos[:, p]].sum()) / 2
    assert torch.allclose(loss, expected, atol=1e-6)
    assert logs["spa_no_positive_share"] == pytest.approx(1 / 3)
    unweighted, _ = smooth_proxy_anchor_loss(cos, conf, weight_negatives=False, **kw)
    assert unweighted > loss  # weights <= 1 only shrink the log-sums
    per_sample, _ = smooth_proxy_anchor_loss(cos, conf, weighting="sample", **kw)
    assert not torch.allclose(per_sample, loss)


@pytest.mark.parametrize("weighting", ["pair", "sample"])
@pytest.mark.parametrize("weight_negatives", [True, False])
@pytest.mark.parametrize("one_sided", [False, True])
def test_every_reading_of_the_loss_matches_its_formula(weighting, weight_negatives, one_sided):
    """Each reading the text allows (docs/methods/smooth_proxy_anchor.md): the positive weight per pair S(c(x, p)) or
    per sample S(max_q c(x, q)); negatives weighted by 1 - S(c(x, p)) or by 1; S two-sided (sigmoid) or one-sided
    (min(1, 2 sigmoid): a sample at or above the position keeps weight 1), written out term by term."""
    cos = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.3, -0.1], [0.5, -0.4, 0.2], [0.1, 0.6, 0.7]])
    conf = torch.tensor([[0.8, 0.1, 0.05], [0.6, 0.7, 0.2], [0.2, 0.3, 0.1], [0.35, 0.9, 0.45]])
    kw = dict(alpha=4.0, margin=0.1, tau=0.4, sharpness=10.0, position=0.5)
    loss, _ = smooth_proxy_anchor_loss(cos, conf, weighting=weighting, weight_negatives=weight_negatives,
                                       one_sided=one_sided, **kw)

    def S(c):
        value = 1 / (1 + np.exp(-10 * (c - 0.5)))
        return min(1.0, 2 * value) if one_sided else value

    pos_sums, neg_sums = [0.0] * 3, [0.0] * 3
    for x in range(4):
        top = float(conf[x].max())
        for p in range(3):
            c = float(conf[x, p])
            if c >= 0.4:
                w = S(top) if weighting == "sample" else S(c)
                pos_sums[p] += w * np.exp(-4 * (float(cos[x, p]) - 0.1))
            else:
                w = 1 - S(c) if weight_negatives else 1.0
                neg_sums[p] += w * np.exp(4 * (float(cos[x, p]) + 0.1))
    with_positive = [p for p in range(3) if (conf[:, p] >= 0.4).any()]
    expected = sum(np.log1p(pos_sums[p]) for p in with_positive) / len(with_positive) \
        + sum(np.log1p(v) for v in neg_sums) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    if one_sided:  # at or above the position: weight 1 (0 as a negative); below: 2 sigmoid
        assert smoothing(torch.tensor([0.5, 0.9, 0.45]), 10.0, 0.5, one_sided=True).tolist() == pytest.approx(
            [1.0, 1.0, 2 / (1 + np.exp(0.5))])


def test_the_phase_2_ramp_phases_the_weights_in():
    """ramp_epochs (phase 2's schedule): every weight w enters as 1 - r (1 - w), r = epoch / ramp_epochs up to 1:
    at r = 0 every kept term has weight 1 (Proxy-Anchor over the relabelled positives), at r = 1 the full weights."""
    cos = torch.tensor([[0.9, 0.1], [0.2, 0.3], [0.5, -0.4]])
    conf = torch.tensor([[0.8, 0.1], [0.6, 0.7], [0.2, 0.3]])
    kw = dict(alpha=4.0, margin=0.1, tau=0.5, sharpness=10.0, position=0.5)
    full, _ = smooth_proxy_anchor_loss(cos, conf, **kw)
    assert smooth_proxy_anchor_loss(cos, conf, ramp=1.0, **kw)[0] == full
    start, _ = smooth_proxy_anchor_loss(cos, conf, ramp=0.0, **kw)
    unweighted, _ = smooth_proxy_anchor_loss(cos, conf, hard=True, **{**kw, "position": -1.0},
                                             weight_negatives=False)  # S = 1 for every positive, negatives by 1
    assert start.item() == pytest.approx(unweighted.item(), rel=1e-6)
    half, _ = smooth_proxy_anchor_loss(cos, conf, ramp=0.5, **kw)
    s = torch.sigmoid(10 * (conf - 0.5))
    pos, w_pos, w_neg = conf >= 0.5, 1 - 0.5 * (1 - s), 1 - 0.5 * s
    expected = sum(torch.log1p((w_pos[:, p] * torch.exp(-4 * (cos[:, p] - 0.1)))[pos[:, p]].sum()) / 2
                   + torch.log1p((w_neg[:, p] * torch.exp(4 * (cos[:, p] + 0.1)))[~pos[:, p]].sum()) / 2
                   for p in range(2))
    assert half.item() == pytest.approx(expected.item(), rel=1e-6)
    labels = np.array([0, 0, 1, 1, 2, 2])
    method = build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss", ramp_epochs=4),
                                                    _one_hot_inputs(labels, k=2)))
    assert method.hparams["ramp_epochs"] == 4


def test_relabelling_follows_tau():
    conf = torch.tensor([[0.7, 0.3, 0.0], [0.45, 0.55, 0.0], [0.1, 0.1, 0.1]])
    assert relabel(conf, 0.5).tolist() == [[True, False, False], [False, True, False], [False, False, False]]
    assert relabel(conf, 0.25).tolist() == [[True, True, False], [True, True, False], [False, False, False]]
    assert smoothing(torch.tensor([0.49, 0.5]), 10.0, 0.5, hard=True).tolist() == [0.0, 1.0]
    # the method's decisions: the given label survives only at >= tau; the top class passing tau relabels
    labels = np.array([0, 0, 2])  # row 1's given label (0) has 0.45 < tau: dropped, relabelled 1
    values, classes = conf.topk(2, dim=1)
    inputs = {"confidence_classes": classes.numpy(), "confidence_values": values.numpy(),
              "confidence_label": labels}
    for tau, keep, pseudo in ((0.5, [1, 0, 0], [0, 1, -1]), (0.25, [1, 1, 0], [0, 1, -1])):
        method = build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss", tau=tau), inputs, 3))
        d = method.decisions()
        assert d.keep.tolist() == keep and d.pseudo_labels.tolist() == pseudo
        assert (d.weights[np.array(keep) == 0] == 0).all()
    dense = dense_confidences(classes, values, 3)
    assert torch.allclose(dense[:, :2], conf[:, :2]) and (dense[:, 2] == 0).all()


def test_phase_2_refuses_confidences_of_other_labels_or_missing_inputs():
    labels = np.array([0, 1, 2, 3])
    other = _one_hot_inputs(np.array([0, 1, 2, 4]))
    with pytest.raises(ValueError, match="other labels .1 of 4 rows differ"):
        build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss"), other))
    longer = _one_hot_inputs(np.array([0, 1, 2, 3, 3]))
    with pytest.raises(ValueError, match="other labels"):
        build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss"), longer))
    with pytest.raises(ValueError, match="missing: confidence_label"):
        inputs = _one_hot_inputs(labels)
        del inputs["confidence_label"]
        build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss"), inputs))
    with pytest.raises(ValueError, match="class ids in 0..2"):
        build_method("spa_smooth_loss", _setup(labels % 3, _hparams("spa_smooth_loss"),
                                                _one_hot_inputs(labels) | {"confidence_label": labels % 3}, 3))


def test_phase_2_refuses_confidences_of_another_dataset(tmp_path):
    from noisydml.data import DatasetError
    from noisydml.pipeline.rundata import RunData, take_upstream

    labels = np.array([0, 0, 1, 1])
    truth = GroundTruth(np.zeros(4, bool), labels.copy(), np.ones(4, bool))
    data = RunData(None, None, None, ImageSet(torch.zeros(4, 1, 4, 4), labels), None, truth,
                   np.array([10, 11, 12, 13]), "fp", None, None, None, None)
    exports = _one_hot_inputs(labels)
    np.savez(tmp_path / "exports.npz", sample_id=np.array([0, 1, 2, 3]), **exports)  # another dataset's ids
    with pytest.raises(DatasetError, match="has no value for 4 training samples"):
        take_upstream(data, tmp_path, {"label": "", "keep": "", "kind": "label_ids"}, list(exports), "chained run x")


@pytest.fixture(scope="module")
def data():
    images, labels, _ = glyphs.generate(12, 6, 16, seed=0)
    train, test = labels < 6, labels >= 6
    return ImageSet(images[train], labels[train]), ImageSet(images[test], labels[test])


def _fit(method, hparams, data, tmp_path, inputs=None):
    cfg = copy.deepcopy(PARAMS["train"])
    cfg.update({"epochs": 2, "batch": {"classes": 3, "per_class": 2}, "backbone_width": 4, "embedding_dim": 8,
                "pretrained": "embedded"})
    model = build_model(cfg, in_channels=1)  # grey glyphs
    with torch.no_grad():  # batch-norm statistics that a training step in train mode would move
        for m in model.backbone.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    start = copy.deepcopy(model.backbone.state_dict())
    spec = RunSpec(method, hparams, cfg, seed=5, data_fingerprint="test")
    result = fit_job(spec, *data, checkpoint_path=tmp_path / f"{method}.pt",
                     runtime={**PARAMS["runtime"], "progress": False}, inputs=inputs, backbone_state=start)
    return start, result


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["spa_smooth_loss", "proxy_anchor_frozen"])
def test_a_frozen_backbone_and_its_batchnorm_do_not_move_while_head_and_proxies_train(data, tmp_path, method):
    labels = data[0].labels
    inputs = _one_hot_inputs(labels, k=2, num_classes=6) if method == "spa_smooth_loss" else None
    start, result = _fit(method, _hparams(method), data, tmp_path, inputs)
    assert _same(start, result.model.backbone.state_dict())  # weights and running statistics
    fresh_head = build_model({**PARAMS["train"], "backbone_width": 4, "embedding_dim": 8}, 1).head
    assert not torch.equal(result.model.head.weight, fresh_head.weight)
    proxies = dict(result.method.named_parameters())
    assert any("proxies" in k for k in proxies)
    # proxies moved from their initialisation
    again = build_method(method, _setup(labels, _hparams(method), inputs, 6, 8, result.model.backbone.out_dim))
    assert not any(torch.equal(p, dict(again.named_parameters())[k]) for k, p in proxies.items())
    # fine-tuning, for comparison: the backbone moves
    start, tuned = _fit(method, _hparams(method, freeze_backbone=False), data, tmp_path / "tuned", inputs)
    assert not _same(start, tuned.model.backbone.state_dict())


def test_phase_1_trains_only_the_confidence_module_and_exports_top_k(data, tmp_path):
    labels = data[0].labels
    start, result = _fit("spa_confidence", _hparams("spa_confidence", top_k=4), data, tmp_path)
    assert _same(start, result.model.backbone.state_dict())
    exports = result.exports
    assert exports["confidence_classes"].shape == (len(labels), 4)
    assert (np.diff(exports["confidence_values"], axis=1) <= 0).all()  # largest first
    assert np.array_equal(exports["confidence_label"], labels)
    d = result.method.decisions()
    assert np.array_equal(d.pseudo_labels, exports["confidence_classes"][:, 0])
    assert np.array_equal(d.keep, (d.pseudo_labels == labels).astype(float))
    # the exports are what phase 2 reads
    build_method("spa_smooth_loss", _setup(labels, _hparams("spa_smooth_loss"), exports, 6, 8))
    with pytest.raises(ValueError, match="other labels"):
        build_method("spa_smooth_loss", _setup((labels + 1) % 6, _hparams("spa_smooth_loss"), exports, 6, 8))


def test_freezing_a_random_backbone_is_refused():
    with pytest.raises(ParamsError, match="methods.spa_confidence.freeze_backbone: true freezes a randomly"):
        check_frozen_backbone({"freeze_backbone": True}, {"pretrained": "none"}, "methods.spa_confidence")
    check_frozen_backbone({"freeze_backbone": False}, {"pretrained": "none"}, "methods.spa_confidence")
    raw = copy.deepcopy(load_params("params.yaml"))
    raw["train"]["pretrained"] = "none"
    with pytest.raises(ParamsError, match="freeze_backbone"):
        check_all(raw)


def test_the_judge_reads_keep_as_a_noise_detector_and_scores_confidence_auroc():
    noisy = np.array([1, 1, 0, 0, 0, 0], bool)
    truth = GroundTruth(noisy, np.arange(6), np.ones(6, bool))
    keep = np.array([0, 1, 0, 1, 1, 1], float)  # flags rows 0 and 2: one noisy of two flagged, half the noisy
    conf = np.array([0.1, 0.3, 0.2, 0.9, 0.8, 0.7])
    out = score_decisions(Decisions(keep=keep, confidence=conf), truth)
    assert out["diag_flag_precision"] == pytest.approx(0.5) and out["diag_flag_recall"] == pytest.approx(0.5)
    # of the 8 clean-noisy pairs, the clean row scores higher in 7 (0.2 < 0.3 is the exception)
    assert out["diag_confidence_auroc"] == pytest.approx(7 / 8)
    clean_only = score_decisions(Decisions(keep=keep, confidence=conf), GroundTruth(np.zeros(6, bool),
                                                                                 np.arange(6), np.ones(6, bool)))
    assert "diag_flag_precision" not in clean_only and "diag_confidence_auroc" not in clean_only
