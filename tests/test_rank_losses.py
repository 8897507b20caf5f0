"""ROADMAP, the contextual loss and RDML (issue 33): each against its equations on small hand-made batches."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from noisydml.methods.parts.contextual import ContextualLoss
from noisydml.methods.parts.rdml import RescaledHingeContrastiveLoss, rescaled_hinge
from noisydml.methods.parts.roadmap import RoadmapLoss, smooth_upper_heaviside


def _exact_ap(scores: np.ndarray, relevant: np.ndarray) -> float:
    """AP of one query by sorting: the mean over relevant items of the precision at their position."""
    order = np.argsort(-scores, kind="stable")
    hits = relevant[order]
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / hits.sum())


def _batch(seed=0, n=12, classes=3, dim=5):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    z = F.normalize(torch.randn(n, dim, generator=g) + 1.5 * torch.eye(dim)[labels], dim=1).double()
    return z, labels


def _mean_exact_ap(z, labels):
    s = (z @ z.T).numpy()
    aps = []
    for i in range(len(z)):
        others = np.arange(len(z)) != i
        aps.append(_exact_ap(s[i, others], (labels.numpy()[others] == labels.numpy()[i]).astype(float)))
    return float(np.mean(aps))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_smooth_ap_tends_to_the_exact_ap_as_the_temperature_goes_to_zero(seed):
    z, labels = _batch(seed)
    exact = _mean_exact_ap(z, labels)
    gaps = []
    for tau in (0.1, 0.01, 1e-4, 1e-7):
        ap = RoadmapLoss(tau=tau, rank_approximation="sigmoid").supap(z, labels).item()
        gaps.append(abs(ap - exact))
    assert gaps[-1] < 1e-6, gaps
    assert gaps[0] > gaps[-1]
    assert 0.2 < exact < 0.99  # the case has negatives between positives (not a trivial AP = 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_supap_bounds_the_ap_loss_and_is_exact_when_no_negative_outranks_a_positive(seed):
    z, labels = _batch(seed)
    exact = _mean_exact_ap(z, labels)
    for tau in (0.1, 0.01, 1e-4):  # H^- >= H: 1 - SupAP >= 1 - AP at every temperature
        assert RoadmapLoss(tau=tau).supap(z, labels).item() <= exact + 1e-12
    # well-separated classes: every negative is below every positive, and SupAP -> AP = 1 as tau -> 0
    separated = F.normalize(torch.eye(5)[labels].double() + 0.01 * z, dim=1)
    assert _mean_exact_ap(separated, labels) == 1.0
    assert RoadmapLoss(tau=1e-6).supap(separated, labels).item() == pytest.approx(1.0, abs=1e-9)


def test_supap_counts_an_outranking_negative_by_its_upper_bound_in_the_zero_temperature_limit():
    """One query, one positive at s = 0.5, negatives at 0.52 (within delta = 0.05: weight 1.5) and 0.7 (past
    delta: 1.5 + rho (0.2 - 0.05) = 16.5) and 0.1 (below: 0): AP = 1 / (1 + 1.5 + 16.5)."""
    t = torch.tensor([0.02, 0.2, -0.4], dtype=torch.float64)
    weights = smooth_upper_heaviside(t, tau=1e-9, rho=100.0, delta=0.05)
    assert weights.tolist() == pytest.approx([1.5, 16.5, 0.0])
    # the same through the loss: query q, positive p, negatives placed at those similarities to q
    q = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)

    def at(s, sign):
        return torch.tensor([s, sign * math.sqrt(1 - s * s), 0.0], dtype=torch.float64)

    z = torch.stack([q, at(0.5, 1), at(0.52, -1), at(0.7, 1), at(0.1, -1)])
    z[2, 2], z[2, 1] = math.sqrt(1 - 0.52 ** 2), 0.0  # keep the negatives apart from the positive's direction
    labels = torch.tensor([0, 0, 1, 2, 3])
    loss = RoadmapLoss(tau=1e-9)
    sim = z @ z.T
    from noisydml.methods.parts.roadmap import average_precision

    ap, has = average_precision(sim[:1], (labels[:1, None] == labels[None, :]), loss.negative_step)
    assert bool(has[0]) and ap[0].item() == pytest.approx(1 / (1 + 1.5 + 16.5))


def test_calibration_term_is_zero_for_pairs_on_the_right_side_of_the_margins():
    loss = RoadmapLoss()  # alpha = 0.9, beta = 0.6
    a = torch.tensor([1.0, 0.0, 0.0])
    rows = [a, F.normalize(a + torch.tensor([0.0, 0.3, 0.0]), dim=0),      # positive pair, s = 0.958 > 0.9
            torch.tensor([0.0, 1.0, 0.0]), F.normalize(torch.tensor([0.0, 1.0, 0.25]), dim=0)]  # s = 0.970
    z = torch.stack(rows).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1])
    s = z.detach() @ z.detach().T
    assert s[0, 1] > 0.9 and s[2, 3] > 0.9 and s[:2, 2:].max() < 0.6
    value = loss.calibration(z, labels)
    value.backward()
    assert value.item() == 0.0 and z.grad.abs().max().item() == 0.0
    # one positive pair below alpha: exactly its hinge (the mean of the non-zero positive-pair losses)
    z2 = torch.stack([a, F.normalize(torch.tensor([0.8, 0.6, 0.0]), dim=0), rows[2], rows[3]])
    assert loss.calibration(z2, labels).item() == pytest.approx(0.9 - 0.8, abs=1e-6)


def _contextual_by_the_equations(z, labels, k, eps, lam, gamma, s_reg, pos_m, neg_m, g):
    """A loop-by-loop transcription of the contextual loss's equations (module docstring of parts.contextual),
    with the Heaviside written as a straight-through step (value H, gradient g)."""
    b = len(z)
    z = F.normalize(z, dim=1)  # the loss is defined on L2-normalised embeddings
    s = z @ z.T
    d = (2 - 2 * s).clamp(min=0)

    def step(x, threshold):  # H(x - threshold) with gradient g towards x
        return (x >= threshold).double().detach() + g * (x - x.detach())

    def mask(kk):
        rows = []
        for i in range(b):
            kth = sorted((-d[i]).detach().tolist(), reverse=True)[kk - 1]
            rows.append(torch.stack([step(-d[i, j] + eps, kth) for j in range(b)]))
        return torch.stack(rows)

    near = mask(k)
    w_t = [[None] * b for _ in range(b)]
    for i in range(b):
        n_i = near[i].detach().sum()
        f_i = (1 - near[i]).detach().sum()
        for j in range(b):
            both = sum(near[i, l] * near[j, l] for l in range(b)) / n_i
            neither = sum((1 - near[i, l]) * (1 - near[j, l]) for l in range(b)) / max(float(f_i), 1.0)
            w_t[i][j] = 0.5 * (both + neither) * near[i, j]
    half = mask(max(k // 2, 1))
    w = [[None] * b for _ in range(b)]
    for i in range(b):
        r = [half[i, j] * half[j, i] for j in range(b)]
        total = sum(r)
        for j in range(b):
            w[i][j] = sum(r[l] * w_t[l][j] for l in range(b)) / total
    context = 0
    for i in range(b):
        for j in range(b):
            if i != j:
                wij = 0.5 * (w[i][j] + w[j][i])
                context = context + ((1 - wij) ** 2 if labels[i] == labels[j] else wij ** 2)
    context = context / b ** 2
    reg = (s.mean() - s_reg) ** 2
    pos = [torch.relu(pos_m - s[i, j]) for i in range(b) for j in range(b) if i != j and labels[i] == labels[j]]
    neg = [torch.relu(s[i, j] - neg_m) for i in range(b) for j in range(b) if labels[i] != labels[j]]

    def mean_nonzero(values):
        values = torch.stack(values)
        nonzero = values > 0
        return values[nonzero].mean() if nonzero.any() else values.sum() * 0

    contrast = mean_nonzero(pos) + mean_nonzero(neg)
    return lam * context + gamma * reg + (1 - lam - gamma) * contrast


@pytest.mark.parametrize("seed", [0, 3])
def test_contextual_loss_matches_a_direct_transcription_value_and_gradient(seed):
    z0, labels = _batch(seed, n=10, classes=3, dim=4)
    settings = dict(k=4, eps=0.05, lam=0.4, gamma=0.1, s_reg=0.25, pos_m=0.75, neg_m=0.6, g=10.0)
    z_ours = z0.clone().requires_grad_()
    ours = ContextualLoss(k=4, epsilon=0.05, context_weight=0.4, reg_weight=0.1, reg_similarity=0.25,
                          pos_margin=0.75, neg_margin=0.6, step_gradient=10.0)(z_ours, labels)
    ours.backward()
    z_ref = z0.clone().requires_grad_()
    ref = _contextual_by_the_equations(z_ref, labels, **settings)
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(z_ours.grad, z_ref.grad, rtol=1e-7, atol=1e-10)
    assert z_ours.grad.abs().sum() > 0


def test_contextual_similarity_of_two_well_separated_classes_is_one_within_and_zero_across():
    from noisydml.methods.parts.contextual import contextual_similarity

    labels = torch.arange(8) // 4
    z = F.normalize(torch.eye(4)[labels * 2].double() + 0.01 * torch.randn(8, 4, dtype=torch.float64), dim=1)
    w = contextual_similarity(z @ z.T, k=4, epsilon=0.05, g=10.0)
    same = labels[:, None] == labels[None, :]
    assert torch.allclose(w[same], torch.ones_like(w[same])) and torch.allclose(w[~same], torch.zeros_like(w[~same]))


def test_rdml_rescaled_hinge_matches_a_hand_computation():
    # three rows, cosine similarities chosen by hand: s01 = 0.6 (same class), s02 = 0.8, s12 = -0.2 (different)
    z = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.8, -0.6, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    s = z @ z.T
    assert s[0, 1].item() == pytest.approx(0.6) and s[0, 2].item() == pytest.approx(0.8)
    assert s[1, 2].item() == pytest.approx(0.0)
    eta, beta = 2.0, 1 / (1 - math.exp(-2.0))
    # positive pairs (0,1), (1,0): hinge 1 - 0.6 = 0.4; negative pairs (0,2), (2,0): hinge 0.8 - 0 = 0.8;
    # (1,2), (2,1): hinge 0 (left out of the mean of non-zero losses)
    positive = beta * (1 - math.exp(-eta * 0.4))
    negative = beta * (1 - math.exp(-eta * 0.8))
    value = RescaledHingeContrastiveLoss(eta=eta, pos_margin=1.0, neg_margin=0.0)(z, labels)
    assert value.item() == pytest.approx(positive + negative, rel=1e-12)


def test_rescaled_hinge_is_bounded_tends_to_the_hinge_and_keeps_one_at_one():
    h = torch.linspace(0, 5, 11, dtype=torch.float64)
    for eta in (0.5, 1.0, 2.0, 3.0, 4.0):
        value = rescaled_hinge(h, eta)
        assert value.max().item() <= 1 / (1 - math.exp(-eta)) and rescaled_hinge(torch.tensor(1.0), eta).item() == pytest.approx(1.0)
        # concave through (0, 0) and (1, 1): above the hinge below 1, below it past 1 (a large violation costs less)
        assert torch.all(value[h <= 1] >= h[h <= 1] - 1e-12) and torch.all(value[h >= 1] <= h[h >= 1] + 1e-12)
    torch.testing.assert_close(rescaled_hinge(h, 1e-6), h, rtol=1e-5, atol=1e-5)
