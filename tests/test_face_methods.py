"""The face-recognition methods of SGPS's Table IV: DCQ's queue and loss, DCQ + SGPS against Eqs. 18 + 13,
Sub-center ArcFace's drop rule, the momentum key encoder, iResNet's layout."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import FakeServices, grouped_sgps_state
from noisydml.methods import load_spec
from noisydml.methods.base import Batch, MethodSetup
from noisydml.methods.parts.dcq import ClassQueue, KeyEncoder, margin_softmax_loss, pair_rows
from noisydml.schema import ParamsError


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 4)

    def forward_with_features(self, x):
        f = self.backbone(x)
        return F.normalize(self.head(f), dim=1), f


def test_rows_pair_within_their_class_in_batch_order():
    labels = torch.tensor([3, 1, 3, 1, 1, 3, 1, 2])
    q, k = pair_rows(labels)
    pairs = sorted(zip(q.tolist(), k.tolist()))
    assert pairs == [(0, 2), (1, 3), (4, 6)]  # class 3's third row and class 2's only row are no query
    assert all(labels[a] == labels[b] for a, b in pairs)
    q2, k2 = pair_rows(labels, both_ways=True)
    assert sorted(zip(q2.tolist(), k2.tolist())) == sorted(pairs + [(b, a) for a, b in pairs])


def test_the_class_queue_is_fifo_and_keeps_each_key_with_its_own_label():
    queue = ClassQueue(5, 2)
    keys = F.normalize(torch.arange(1.0, 15.0).reshape(7, 2), dim=1)
    queue.enqueue(keys[:3], torch.tensor([0, 1, 2]))
    assert queue.labels.tolist() == [0, 1, 2, -1, -1] and int(queue.pointer) == 3
    queue.enqueue(keys[3:7], torch.tensor([3, 4, 5, 6]))  # wraps: the two oldest leave
    assert queue.labels.tolist() == [5, 6, 2, 3, 4] and int(queue.pointer) == 2
    for slot, label in enumerate(queue.labels.tolist()):  # every slot holds the key enqueued with its label
        assert torch.allclose(queue.features[slot], keys[label])


def test_dcq_loss_matches_eq_18_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(3, 4, generator=g), dim=1).requires_grad_(True)
    k = F.normalize(torch.randn(3, 4, generator=g), dim=1)
    queue = F.normalize(torch.randn(5, 4, generator=g), dim=1)
    queue_labels = torch.tensor([0, 1, 2, -1, 1])
    labels = torch.tensor([0, 1, 2])
    value = margin_softmax_loss(q, k, labels, queue, queue_labels, 50.0, 0.3)
    value.backward()
    q2 = q.detach().double().requires_grad_(True)  # float64: e^{50 x} overflows float32's ratio
    k, queue = k.double(), queue.double()
    terms = []
    for i in range(3):
        pos = torch.exp(50 * (q2[i] @ k[i] - 0.3))
        neg = sum(torch.exp(50 * (q2[i] @ queue[j])) for j in range(5)
                  if queue_labels[j] >= 0 and queue_labels[j] != labels[i])
        terms.append(-torch.log(pos / (pos + neg)))
    direct = torch.stack(terms).mean()
    direct.backward()
    assert value.item() == pytest.approx(direct.item(), rel=1e-5)
    assert torch.allclose(q.grad.double(), q2.grad, atol=1e-4)


def test_dcq_trains_queries_against_earlier_keys_and_enqueues_its_keys():
    spec = load_spec("dcq")
    hp = spec.check({"queue_size": 6, "momentum": 0.5}, "methods.dcq")
    services = FakeServices(_Net)
    labels = np.array([0, 0, 1, 1, 2, 2])
    m = spec.build(MethodSetup(hp, 3, 4, 6, labels, seed=0, services=services))
    g = torch.Generator().manual_seed(0)
    keys = F.normalize(torch.randn(6, 4, generator=g), dim=1)
    services.forward_with = lambda net: (keys, keys)
    emb = F.normalize(torch.randn(6, 4, generator=g), dim=1).requires_grad_(True)
    batch = Batch(emb, emb, torch.as_tensor(labels), torch.arange(6), torch.arange(6), step=0, epoch=0)
    value, _ = m.loss(batch)
    assert value.item() == pytest.approx(0.0, abs=1e-6)  # an empty queue: no negative yet
    assert m.queue.labels.tolist()[:3] == [0, 1, 2]
    assert torch.allclose(m.queue.features[:3], keys[[1, 3, 5]])  # the keys (second rows), with their labels
    value, _ = m.loss(batch)
    expected = margin_softmax_loss(emb[[0, 2, 4]], keys[[1, 3, 5]], torch.tensor([0, 1, 2]), keys[[1, 3, 5]],
                                   torch.tensor([0, 1, 2]), 50.0, 0.3)
    assert value.item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_key_encoder_starts_as_the_model_and_follows_it_by_momentum():
    services = FakeServices(_Net)
    encoder = KeyEncoder(MethodSetup({}, 2, 4, 2, np.zeros(2, int), 0, services=services), "test")
    model = _Net()
    encoder.copy_from(model)
    assert all(torch.equal(a, b) for a, b in zip(encoder.network.parameters(), model.parameters()))
    assert not any(p.requires_grad for p in encoder.network.parameters())
    before = [p.clone() for p in encoder.network.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    encoder.follow(model, 0.9)
    for key, old, query in zip(encoder.network.parameters(), before, model.parameters()):
        assert torch.allclose(key, 0.9 * old + 0.1 * query)


def _dcq_sgps(**hp):
    spec = load_spec("dcq_sgps")
    params = {"memory_size": 8, "noise_rate": 0.5, "window": 1, "temperature": 0.1, "margin": 0.2, "ppm": "mean",
              "gamma_batch": 1.0, "gamma_bank": 0.5, "clean_scale": 10.0, "clean_margin": 0.3,
              "positive_source": "bank", "positives": "both", "sgm": {}, "transproto": {}, "authors": {}, **hp}
    hparams = spec.check(params, "methods.dcq_sgps")
    labels = np.repeat(np.arange(4), 3)
    services = FakeServices(_Net)
    return spec.build(MethodSetup(hparams, 4, 4, 12, labels, seed=0, services=services)), labels, services


def test_dcq_sgps_loss_is_eq_18_on_kept_queries_plus_eqs_13_to_16_on_rejected_ones():
    m, labels, services = _dcq_sgps()
    g = grouped_sgps_state(m, seed=3)
    queue = F.normalize(torch.randn(5, 4, generator=g), dim=1)
    queue_labels, queue_rows = torch.tensor([0, 1, 2, 3, 1]), torch.tensor([1, 4, 7, 10, 5])
    m.memory.enqueue(queue, queue_labels, queue_rows)
    index = torch.tensor([0, 1, 3, 4, 6, 7, 9, 10])  # two rows of each class: pairs (0,1) (3,4) (6,7) (9,10)
    batch_labels = torch.as_tensor(labels[index.numpy()])
    keys = F.normalize(torch.randn(8, 4, generator=g), dim=1)
    services.forward_with = lambda net: (keys, keys)
    keep = torch.tensor([True, True, False, True, True, False, True, True])
    m.select = lambda embeddings, lab, step: keep  # PCS's choice, fixed here: this test is of the loss
    emb = F.normalize(torch.randn(8, 4, generator=g), dim=1).requires_grad_(True)
    value, _ = m.loss(Batch(emb, emb, batch_labels, index, index, step=5, epoch=0))
    value.backward()

    e = emb.detach().clone().requires_grad_(True)
    # Eq. 18 on the kept queries (batch positions 0, 4, 6; query 2 was rejected) with their partners' keys
    clean = []
    for a, b in ((0, 1), (4, 5), (6, 7)):
        pos = torch.exp(10 * (e[a] @ keys[b] - 0.3))
        neg = sum(torch.exp(10 * (e[a] @ queue[j])) for j in range(5) if queue_labels[j] != batch_labels[a])
        clean.append(-torch.log(pos / (pos + neg)))
    # Eqs. 13-16 on the rejected rows (positions 2 and 5: rows 3 and 7), bank positives (the ones drawn)
    cb, ct = m.bottom_up_labels.numpy(), m.top_down_labels.numpy()
    rows = index.numpy()
    batch_terms, bank_terms = [], []
    for a in (2, 5):
        r = rows[a]
        drawn = m.drawn[r].numpy()
        proto = F.normalize(m.bank[drawn].mean(0), dim=0)
        p = (e[a] @ proto - 0.2) / 0.1
        negs = [(e[a] @ e[j]) / 0.1 for j, rj in enumerate(rows)
                if labels[rj] != labels[r] and cb[rj] != cb[r] and ct[rj] != ct[r]]
        batch_terms.append(-p + torch.logsumexp(torch.stack([p, *negs]), 0))
        negs = [(e[a] @ queue[j]) / 0.1 for j, (rj, lj) in enumerate(zip(queue_rows.tolist(), queue_labels.tolist()))
                if lj != labels[r] and cb[rj] != cb[r] and ct[rj] != ct[r]]
        bank_terms.append(-p + torch.logsumexp(torch.stack([p, *negs]), 0))
    direct = torch.stack(clean).mean() + torch.stack(batch_terms).mean() + 0.5 * torch.stack(bank_terms).mean()
    direct.backward()
    assert value.item() == pytest.approx(direct.item(), rel=1e-5)
    assert torch.allclose(emb.grad, e.grad, atol=1e-5)
    # enqueued: the keys of the used pairs whose key row was kept too (positions 1 and 7; 5 was rejected)
    assert m.memory.labels.tolist()[5:7] == [0, 3] and m.memory.rows.tolist()[5:7] == [1, 10]
    assert torch.allclose(m.memory.features[5:7], keys[[1, 7]])


def test_dcq_sgps_refuses_the_authors_second_clean_loss():
    with pytest.raises(ParamsError, match="clean_loss_on_all"):
        _dcq_sgps(positive_source="forward", authors={"selection_on_all": True, "clean_loss_on_all": True})


def test_subcenter_drop_rule_on_a_hand_case():
    from pytorch_metric_learning import losses

    from noisydml.methods.subcenter_arcface import dominant_drop

    loss = losses.SubCenterArcFaceLoss(num_classes=2, embedding_size=2, sub_centers=3)
    angle = lambda deg: [math.cos(math.radians(deg)), math.sin(math.radians(deg))]  # noqa: E731
    with torch.no_grad():  # class 0's centres at 0, 120, 240 degrees; class 1's at 90, 200, 300
        loss.W.copy_(torch.tensor([angle(0), angle(120), angle(240), angle(90), angle(200), angle(300)]).T)
    # class 0: three rows near 0 deg (dominant), one near 120 (its own sub-centre, 110 deg from the dominant: far),
    # one at 60 (nearest the dominant and within 75); class 1: two near 90, one at 180 (90 deg away: dropped)
    embeddings = torch.tensor([angle(5), angle(-5), angle(10), angle(115), angle(60), angle(85), angle(95),
                               angle(180)])
    labels = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    keep, dominant = dominant_drop(loss, embeddings, labels, 75.0)
    assert keep.tolist() == [True, True, True, False, True, True, True, False]
    assert torch.allclose(dominant[:, 0], torch.tensor(angle(0))) and torch.allclose(dominant[:, 1], torch.tensor(angle(90)))


def test_iresnet50_has_arcface_torchs_layout():
    from noisydml.models import build_model

    model = build_model({"backbone": "iresnet50", "pooling": "avg", "embedding_dim": 512, "frozen_bn": False,
                         "backbone_width": 16}, 3)
    state = model.backbone.state_dict()
    for key in ("conv1.weight", "bn1.running_mean", "prelu.weight", "layer1.0.downsample.0.weight",
                "layer3.13.bn3.running_var", "layer4.2.conv2.weight", "bn2.weight", "features.running_var"):
        assert key in state
    assert tuple(state["fc.weight"].shape) == (512, 512 * 7 * 7)
    assert sum(v.numel() for k, v in model.backbone.named_parameters()) == pytest.approx(43.59e6, rel=1e-3)
    assert not model.backbone.features.weight.requires_grad
    model.eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 512)  # a CPU miniature's size is pooled to 7 x 7
    with pytest.raises(ParamsError, match="pooling"):
        build_model({"backbone": "iresnet18", "pooling": "max", "embedding_dim": 8, "frozen_bn": False,
                     "backbone_width": 16}, 3)
