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
from noisydml.schema import ParamsError, ParamsErrors


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
                         "backbone_width": 16, "iresnet_width": 64}, 3)
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
                     "backbone_width": 16, "iresnet_width": 64}, 3)


def test_iresnet_width_scales_every_stage_and_refuses_published_weights():
    """``train.iresnet_width`` (ours): each stage's channels scale with it (64: arcface_torch's 64/128/256/512); a
    narrower network cannot start from published weights, and says so before any stage runs."""
    from noisydml.models import build_model, check_backbone

    cfg = {"backbone": "iresnet18", "pooling": "avg", "embedding_dim": 16, "frozen_bn": False, "backbone_width": 16,
           "iresnet_width": 8, "pretrained": "none"}
    state = build_model(cfg, 3).backbone.state_dict()
    assert [state[f"layer{i}.0.conv1.weight"].shape[0] for i in (1, 2, 3, 4)] == [8, 16, 32, 64]
    assert tuple(state["fc.weight"].shape) == (512, 64 * 7 * 7)  # the 512-d features whatever the width
    check_backbone(cfg)
    with pytest.raises(ParamsErrors, match=r"train.iresnet_width: 8 with train.pretrained 'ms1mv2_r18'.*allowed: 64"):
        check_backbone({**cfg, "pretrained": "ms1mv2_r18"}, weight_names=("ms1mv2_r18",))
    with pytest.raises(ParamsErrors, match="train.iresnet_width: 8 with train.pretrained 'w.pth'"):
        check_backbone({**cfg, "pretrained": "w.pth"})


def _direct_margin_softmax_ce(cosines, label, kind, margin, scale):
    """One sample's margin-softmax cross-entropy from its cosines to one head's classes, written out."""
    logits = []
    for j, c in enumerate(cosines):
        if j == label:
            if kind == "cosface":
                c = c - margin
            else:  # arcface, straight through: the value cos(theta + m), the gradient that of cos theta
                c = c + (torch.cos(torch.acos(c.detach()) + margin) - c.detach())
        logits.append(scale * c)
    logits = torch.stack(logits)
    return -(logits[label] - torch.logsumexp(logits, 0))


@pytest.mark.parametrize("kind", ["cosface", "arcface"])
def test_skh_loss_is_the_mean_over_samples_of_the_min_over_heads_in_value_and_gradient(kind):
    """SKH (liubx07/SKH ``skh.py``'s equation): rows ``k * classes + j`` are head k's class j; per sample each head's
    margin-softmax CE, the minimum over heads, the batch mean; against a sample-by-sample computation."""
    from noisydml.methods.skh import skh_losses

    g = torch.Generator().manual_seed(0)
    heads, classes, d = 3, 4, 5
    x = torch.randn(6, d, generator=g, dtype=torch.float64).requires_grad_(True)
    w = torch.randn(heads * classes, d, generator=g, dtype=torch.float64).requires_grad_(True)
    labels = torch.tensor([0, 1, 2, 3, 1, 0])
    per_sample, winner = skh_losses(x, labels, w, heads, kind, 0.3, 8.0)
    per_sample.mean().backward()
    x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    xn, wn = x2 / x2.norm(dim=1, keepdim=True), w2 / w2.norm(dim=1, keepdim=True)
    direct, winners = [], []
    for i in range(len(labels)):
        per_head = [_direct_margin_softmax_ce(torch.stack([xn[i] @ wn[k * classes + j] for j in range(classes)]),
                                              int(labels[i]), kind, 0.3, 8.0) for k in range(heads)]
        best = min(range(heads), key=lambda k: float(per_head[k].detach()))
        winners.append(best)
        direct.append(per_head[best])
    total = torch.stack(direct).mean()
    total.backward()
    assert torch.allclose(per_sample.mean(), total, atol=1e-12)
    assert winner.tolist() == winners and len(set(winners)) > 1  # the case exercises more than one head
    assert torch.allclose(x.grad, x2.grad, atol=1e-12) and torch.allclose(w.grad, w2.grad, atol=1e-12)


def test_skh_trains_through_the_method_interface_and_reports_each_heads_share():
    from noisydml.methods.skh import SPEC

    hp = SPEC.check({"heads": 2, "margin_loss": "cosface", "scale": 50.0, "margin": 0.3, "lr_multiplier": 100.0,
                     "proxy_weight_decay_factor": 1.0}, "methods.skh")
    setup = MethodSetup(hparams=hp, num_classes=3, embedding_dim=4, dataset_size=6,
                        train_labels=np.array([0, 0, 1, 1, 2, 2]), seed=0)
    method = SPEC.build(setup)
    assert tuple(method.weight.shape) == (6, 4)
    method.on_epoch_start(None)
    emb = F.normalize(torch.randn(6, 4), dim=1).requires_grad_(True)
    batch = Batch(embeddings=emb, features=emb, labels=torch.tensor([0, 0, 1, 1, 2, 2]), index=torch.arange(6),
                  sample_id=torch.arange(6), step=0, epoch=0)
    value, _ = method.loss(batch)
    value.backward()
    assert method.weight.grad is not None and emb.grad is not None
    shares = method.on_epoch_end(None)
    assert set(shares) == {"skh_head_0_share", "skh_head_1_share"} and sum(shares.values()) == pytest.approx(1.0)
    with pytest.raises(ParamsError, match="margin_loss"):
        SPEC.check({**hp, "margin_loss": "sphereface"}, "methods.skh")


def test_arcface_margin_is_half_a_radian_and_arcface_torchs_formulation_is_straight_through():
    """0.5 rad exactly (pml takes degrees); ``formulation: arcface_torch`` gives pml's loss value where pml's
    threshold does not apply and the gradient of ``s cos theta`` at the target (insightface's current code)."""
    from noisydml.methods.arcface import SPEC
    from noisydml.methods.parts.margin_softmax import arcface_loss

    hp = SPEC.check({"loss": {"margin": 28.64788975654116, "scale": 64.0, "formulation": "pml"},
                     "lr_multiplier": 100.0, "proxy_weight_decay_factor": 1.0}, "methods.arcface")
    assert math.radians(hp["loss"]["margin"]) == pytest.approx(0.5, abs=1e-15)
    g = torch.Generator().manual_seed(1)
    emb = F.normalize(torch.randn(5, 3, generator=g, dtype=torch.float64), dim=1)
    labels = torch.tensor([0, 1, 2, 0, 1])
    pml, ours = (arcface_loss(3, 3, hp["loss"]["margin"], 4.0, f) for f in ("pml", "arcface_torch"))
    for loss in (pml, ours):
        with torch.no_grad():
            loss.W.copy_(F.normalize(torch.randn(3, 3, generator=torch.Generator().manual_seed(2),
                                                 dtype=torch.float64), dim=0))
    e1, e2 = emb.clone().requires_grad_(True), emb.clone().requires_grad_(True)
    v1, v2 = pml(e1, labels), ours(e2, labels)
    assert torch.allclose(v1, v2)  # every target angle here is below pi - m: the same value
    v1.backward(), v2.backward()
    assert not torch.allclose(e1.grad, e2.grad)  # the gradients differ: through the angle vs straight through
    # the straight-through gradient is that of CE over s * (cos + the margin's shift held constant)
    e3 = emb.clone().requires_grad_(True)
    cos = F.normalize(e3, dim=1) @ F.normalize(ours.W, dim=0)
    target = cos[torch.arange(5), labels]
    shift = (torch.cos(torch.acos(target) + 0.5) - target).detach()
    logits = 4.0 * (cos + F.one_hot(labels, 3) * shift.unsqueeze(1))
    F.cross_entropy(logits, labels).backward()
    assert torch.allclose(e2.grad, e3.grad, atol=1e-12)
    with pytest.raises(ParamsError, match="formulation"):
        SPEC.check({"loss": {"margin": 28.6, "scale": 64.0, "formulation": "insightface"}, "lr_multiplier": 1.0,
                    "proxy_weight_decay_factor": 1.0}, "methods.arcface")


def test_subcenter_drop_removes_identities_left_without_a_row_from_the_softmax():
    from noisydml.methods.subcenter_arcface import ArcFaceOverLiveIdentities

    loss = ArcFaceOverLiveIdentities(num_classes=3, embedding_size=2, margin=28.64788975654116, scale=8.0)
    emb = F.normalize(torch.randn(4, 2, generator=torch.Generator().manual_seed(3)), dim=1)
    labels = torch.tensor([0, 0, 1, 1])
    full = loss(emb, labels)
    loss.alive.copy_(torch.tensor([True, True, False]))  # identity 2 kept no row
    without = loss(emb, labels)
    two = ArcFaceOverLiveIdentities(num_classes=2, embedding_size=2, margin=28.64788975654116, scale=8.0)
    with torch.no_grad():
        two.W.copy_(loss.W[:, :2])
    assert torch.allclose(without, two(emb, labels)) and not torch.allclose(full, without)


def test_dcq_skh_is_the_min_over_queues_of_eq_18_in_value_and_gradient_and_keys_join_the_winning_queue():
    """DCQ + SKH (ours: how they combine): per query Eq. 18 against each of K queues, the minimum, the batch mean;
    each query's key joins the queue it chose. Against a query-by-query float64 computation."""
    spec = load_spec("dcq_skh")
    hp = spec.check({"queue_size": 4, "heads": 2, "scale": 10.0, "margin": 0.3, "momentum": 0.5}, "methods.dcq_skh")
    services = FakeServices(_Net)
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    m = spec.build(MethodSetup(hp, 4, 4, 8, labels, seed=0, services=services))
    g = torch.Generator().manual_seed(3)
    # queue 0 holds class 1's twin-like keys, queue 1 class 0's: the queries of 0 and 1 should switch apart
    m.queues[0].enqueue(F.normalize(torch.randn(3, 4, generator=g), dim=1), torch.tensor([1, 2, 3]))
    m.queues[1].enqueue(F.normalize(torch.randn(2, 4, generator=g), dim=1), torch.tensor([0, 2]))
    queue_state = [(q.features.clone().double(), q.labels.clone()) for q in m.queues]
    keys = F.normalize(torch.randn(8, 4, generator=g), dim=1)
    services.forward_with = lambda net: (keys, keys)
    emb = F.normalize(torch.randn(8, 4, generator=g), dim=1).requires_grad_(True)
    batch = Batch(emb, emb, torch.as_tensor(labels), torch.arange(8), torch.arange(8), step=0, epoch=0)
    m.on_epoch_start(None)
    value, _ = m.loss(batch)
    value.backward()

    q2 = emb.detach().double().requires_grad_(True)
    terms, winners = [], []
    for query, key in [(0, 1), (2, 3), (4, 5), (6, 7)]:
        per_queue = []
        for features, queue_labels in queue_state:
            pos = torch.exp(10 * (q2[query] @ keys[key].double() - 0.3))
            usable = [j for j in range(4) if queue_labels[j] >= 0 and queue_labels[j] != labels[query]]
            neg = sum((torch.exp(10 * (q2[query] @ features[j])) for j in usable), torch.zeros((), dtype=torch.float64))
            per_queue.append(-torch.log(pos / (pos + neg)))
        best = min(range(2), key=lambda k: float(per_queue[k].detach()))
        winners.append(best)
        terms.append(per_queue[best])
    direct = torch.stack(terms).mean()
    direct.backward()
    assert value.item() == pytest.approx(direct.item(), rel=1e-5)
    assert torch.allclose(emb.grad.double(), q2.grad, atol=1e-5)
    assert len(set(winners)) > 1  # the case exercises both queues
    for k, queue in enumerate(m.queues):  # each key went to the queue its query chose, after the earlier entries
        expected = queue_state[k][1].tolist()
        filled = int((queue_state[k][1] >= 0).sum())
        for i, label in enumerate(label for label, w in zip([0, 1, 2, 3], winners) if w == k):
            expected[(filled + i) % 4] = label  # FIFO: past the end, the oldest slot
        assert queue.labels.tolist() == expected
    shares = m.on_epoch_end(None)
    assert shares == {f"dcq_skh_queue_{k}_share": winners.count(k) / 4 for k in range(2)}
