"""BSPML (methods/parts/bspml.py) against direct evaluations of the paper's equations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning import losses, miners

from noisydml.methods.parts.bspml import (
    ClassIndex, age_unit, exact_gradient, maw_sdaw, sampled_gradient, weight_step, weighted_ms_loss, xi_negative,
    xi_negative_topk, xi_positive,
)
from noisydml.neighbours import knn, similarity_blocks
from noisydml.schema import ParamsError


def _batch(seed=0, classes=4, per_class=4, dim=8):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g)
    labels = torch.arange(classes).repeat_interleave(per_class)
    emb = centres[labels] + 0.9 * torch.randn(len(labels), dim, generator=g)
    return torch.nn.functional.normalize(emb, dim=1), labels


def _eq7_direct(emb, labels, w, miner, alpha, beta, base):
    """Eq. 7 anchor by anchor, from the mined pair lists."""
    a1, p, a2, n = miner(emb, labels)
    sim = emb @ emb.T
    total = 0.0
    for i in range(len(emb)):
        pos = p[a1 == i].tolist()
        neg = n[a2 == i].tolist()
        term = 0.0
        if pos:
            term += sum(w[j] for j in pos) / (len(pos) * alpha) * np.log(
                1 + sum(np.exp(-alpha * (float(sim[i, j]) - base)) for j in pos))
        if neg:
            term += sum(w[j] for j in neg) / (len(neg) * beta) * np.log(
                1 + sum(np.exp(beta * (float(sim[i, j]) - base)) for j in neg))
        total += float(w[i]) * term
    return total / len(emb)


def test_eq7_matches_a_direct_evaluation_and_pml_ms_with_unit_weights():
    emb, labels = _batch()
    miner = miners.MultiSimilarityMiner(epsilon=0.1)
    assert len(miner(emb, labels)[0]) and len(miner(emb, labels)[2])  # pairs are mined: a real check
    w = torch.rand(len(emb), generator=torch.Generator().manual_seed(1)).double()
    for alpha, beta, base in [(2.0, 50.0, 1.0), (2.0, 40.0, 0.5)]:
        got = weighted_ms_loss(emb.double(), labels, w, miner, alpha, beta, base)
        assert got.item() == pytest.approx(_eq7_direct(emb.double(), labels, w.numpy(), miner, alpha, beta, base),
                                           rel=1e-9)
        ones = weighted_ms_loss(emb, labels, torch.ones(len(emb)), miner, alpha, beta, base)
        pml = losses.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)(emb, labels, miner(emb, labels))
        assert ones.item() == pytest.approx(pml.item(), rel=1e-6)


def test_eq7_weights_are_constants_of_the_model_step():
    emb, labels = _batch()
    emb.requires_grad_(True)
    w = torch.rand(len(emb), requires_grad=True)
    weighted_ms_loss(emb, labels, w, miners.MultiSimilarityMiner(0.1), 2.0, 50.0, 1.0).backward()
    assert w.grad is None and emb.grad is not None


def _xi_direct(emb, labels, alpha, beta, base):
    n = len(emb)
    sim = emb @ emb.T
    pos = np.array([np.log1p(sum(np.exp(-alpha * (sim[a, p] - base)) for p in range(n)
                                 if p != a and labels[p] == labels[a])) / alpha for a in range(n)])
    neg = np.array([np.log1p(sum(np.exp(beta * (sim[a, q] - base)) for q in range(n)
                                 if labels[q] != labels[a])) / beta for a in range(n)])
    return pos, neg


def test_xi_is_eq3_over_the_whole_set_in_blocks():
    emb, labels = _batch(classes=5, per_class=6)
    emb, labels = emb.double().numpy(), labels.numpy()
    labels[3] = 4  # an uneven class
    pos, neg = _xi_direct(emb, labels, 2.0, 10.0, 0.5)
    index = ClassIndex.of(labels)
    assert np.allclose(xi_positive(emb, index, 2.0, 0.5), pos, atol=1e-5)
    # blocks of 7 rows: the block loop, not one matrix
    assert np.allclose(xi_negative(emb, labels, 10.0, 0.5, similarity_blocks, block_rows=7), neg, atol=1e-5)
    rows = np.array([0, 11, 29])
    assert np.allclose(xi_negative(emb, labels, 10.0, 0.5, similarity_blocks, rows=rows), neg[rows], atol=1e-5)
    # top-k with k = all rows is exact; fewer neighbours give a lower bound
    assert np.allclose(xi_negative_topk(emb, labels, 10.0, 0.5, len(emb) - 1, knn), neg, atol=1e-5)
    assert np.all(xi_negative_topk(emb, labels, 10.0, 0.5, 5, knn) <= neg + 1e-6)


def _eq6(w, xi_pos, xi_neg, labels, lam, mu):
    """Eq. 6 (1/N^k inside the sum over classes), written out term by term in torch."""
    classes = sorted(set(labels.tolist()))
    C = len(classes)
    rows = {c: [i for i in range(len(labels)) if labels[i] == c] for c in classes}
    zeta = {c: sum(w[i] for i in rows[c]) for c in classes}
    total = 0.0
    for c in classes:
        n_c = len(rows[c])
        neg_factor = sum(zeta[k] / len(rows[k]) for k in classes if k != c) / (C - 1)
        for a in rows[c]:
            pos_factor = (zeta[c] - w[a]) / (n_c - 1) if n_c > 1 else 0.0
            total = total + w[a] / n_c * (pos_factor * xi_pos[a] + neg_factor * xi_neg[a])
    total = total - lam * sum(zeta[c] / len(rows[c]) for c in classes)
    for i, c in enumerate(classes):
        for k in classes[i + 1:]:
            total = total + mu / (C - 1) * (zeta[c] / len(rows[c]) - zeta[k] / len(rows[k])) ** 2
    return total


def _eq6_gradient_problem(labels, seed, lam=1.3, mu=0.7):
    """Random xi and weights on ``labels``, and torch's derivative of the direct Eq. 6 at those weights."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    xi_pos, xi_neg = rng.uniform(0.5, 3.0, n), rng.uniform(0.0, 1.0, n)
    w0 = rng.uniform(0.2, 1.0, n)
    w = torch.tensor(w0, requires_grad=True)
    _eq6(w, torch.tensor(xi_pos), torch.tensor(xi_neg), labels, lam, mu).backward()
    return xi_pos, xi_neg, w0, lam, mu, w.grad.numpy()


def test_eq8_is_an_unbiased_estimate_of_the_eq6_gradient():
    labels = np.array([0] * 5 + [1] * 3 + [2] * 4 + [3] * 6)
    n = len(labels)
    xi_pos, xi_neg, w0, lam, mu, exact = _eq6_gradient_problem(labels, seed=0)
    index = ClassIndex.of(labels)
    zeta = np.bincount(labels, weights=w0)
    coords = np.arange(n)
    draws = 40000
    total = np.zeros(n)
    gen = np.random.default_rng(1)
    for _ in range(draws // 1000):
        batch = np.tile(coords, 1000)
        g = sampled_gradient(batch, w0, zeta, xi_pos, xi_neg, index, lam, mu, classes=2, per_class=2, rng=gen)
        total += g.reshape(1000, n).sum(axis=0)
    mean = total / draws / index.count[labels]  # Eq. 8's 1/N^c
    assert np.allclose(mean, exact, atol=5e-3), np.abs(mean - exact).max()
    assert np.abs(exact).max() > 0.05  # a gradient far from 0: the tolerance means something


def test_weights_stay_in_the_unit_interval_and_the_step_is_seeded():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 8)
    xi_pos, xi_neg = rng.uniform(1, 3, len(labels)), rng.uniform(0, 0.5, len(labels))
    index = ClassIndex.of(labels)
    for lam in (0.0, 2.0, 50.0):
        w = weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, lam, 1.0, 5.0, 3, 4, 4, 7,
                        np.random.default_rng(3))
        assert w.min() >= 0.0 and w.max() <= 1.0
    a = weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, 2.0, 1.0, 0.5, 3, 4, 4, 7, np.random.default_rng(3))
    b = weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, 2.0, 1.0, 0.5, 3, 4, 4, 7, np.random.default_rng(3))
    assert np.array_equal(a, b)


def _fixed_xi_problem():
    rng = np.random.default_rng(7)
    labels = np.repeat(np.arange(8), 10)
    # classes differ in how hard they are, so that their mean weights differ without the balance term
    hardness = np.repeat(np.linspace(0.0, 1.2, 8), 10)
    xi_pos = 1.5 + hardness + rng.uniform(0, 1.0, len(labels))
    xi_neg = rng.uniform(0, 0.3, len(labels))
    return labels, xi_pos, xi_neg


def _converged(labels, xi_pos, xi_neg, lam, mu, block=1):
    index = ClassIndex.of(labels)
    return weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, lam, mu, 0.05, 200, 4, 4, block,
                       np.random.default_rng(0))


@pytest.mark.parametrize("block", [1, 16])
def test_larger_age_gives_larger_maw_and_larger_mu_smaller_sdaw(block):
    """Slow with block 1 (about 7 s): six weight solves to convergence, one coordinate at a time, the exact
    Alg. 3 the blocked solver must agree with."""
    labels, xi_pos, xi_neg = _fixed_xi_problem()
    maws = [maw_sdaw(_converged(labels, xi_pos, xi_neg, lam, 0.0, block), labels)[0] for lam in (3.0, 4.0, 5.0)]
    assert maws[0] < maws[1] < maws[2], maws
    sdaws = [maw_sdaw(_converged(labels, xi_pos, xi_neg, 4.0, mu, block), labels)[1] for mu in (0.0, 5.0, 50.0)]
    assert sdaws[0] > sdaws[1] > sdaws[2], sdaws


def test_maw_sdaw_are_eq14():
    labels = np.array([0, 0, 1, 1, 1, 2])
    w = np.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.2])
    means = np.array([0.5, 2.5 / 3, 0.2])
    maw, sdaw = maw_sdaw(w, labels)
    assert maw == pytest.approx(means.mean())
    assert sdaw == pytest.approx(np.sqrt(((means - means.mean()) ** 2).mean()))


def test_draws_are_class_mates_other_than_the_anchor_and_rows_of_other_classes():
    labels = np.array([2, 0, 2, 1, 0, 2, 2, 1, 1])
    index = ClassIndex.of(labels)
    for c in range(3):
        assert sorted(index.rows_of(c)) == sorted(np.flatnonzero(labels == c))
    n = len(labels)
    zeta = np.bincount(labels, minlength=3).astype(float)
    for a in range(n):
        mates = (labels == labels[a]) & (np.arange(n) != a)
        # G_p: a itself adds 100, a row of another class 10,000; class-mates add nothing
        xi_pos = np.where(labels != labels[a], 1e4, 0.0)
        xi_pos[a] = 100.0
        # G_n: a row of a's own class adds 1,000; rows of other classes nothing
        xi_neg = np.where(mates, 1e3, 0.0)
        g = sampled_gradient(np.full(2000, a), np.ones(n), zeta, xi_pos, xi_neg, index, 0.0, 0.0, 2, 3,
                             np.random.default_rng(a))
        assert np.allclose(g, 100.0)


def test_params_refuse_an_initial_age_above_the_maximum():
    from noisydml.methods import load_spec

    spec = load_spec("bspml")
    with pytest.raises(ParamsError, match=r"methods.bspml.lambda_0: 6.0 is above lambda_inf"):
        spec.check({"lambda_0": 6.0, "lambda_inf": 5.0}, "methods.bspml")
    with pytest.raises(ParamsError, match=r"methods.bspml.mu: 'x' is not allowed"):
        spec.check({"mu": "x"}, "methods.bspml")
    assert "mu" not in load_spec("spms").schema


def test_decision_histograms_split_weights_by_ground_truth():
    from noisydml.engine.judge import GroundTruth, decision_histograms
    from noisydml.methods.base import Decisions

    noisy = np.array([0, 0, 0, 1, 1], bool)
    truth = GroundTruth(noisy, np.zeros(5, int), np.array([1, 1, 1, 1, 0], bool))  # the last is unverified
    h = decision_histograms(Decisions(weights=np.array([1.0, 0.95, 0.5, 0.05, 0.0])), truth, bins=4)
    assert h["weights"]["edges"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert h["weights"]["clean"] == [0, 0, 1, 2] and h["weights"]["noisy"] == [1, 0, 0, 0]
    assert decision_histograms(Decisions(keep=np.ones(5)), truth) == {} and decision_histograms(None, truth) == {}


def test_bspml_map_and_the_report_of_weights(tmp_path, raw_params):
    import pandas as pd

    from noisydml.pipeline.bspml_maps import bspml_map
    from noisydml.tools.check import validate_all
    from noisydml.pipeline.layout import TRAIN_EMBEDDINGS, Layout
    from noisydml.reporting.tables import weight_summary

    raw_params["figures"]["bspml_maps"] = {"m": {"dataset": "glyphs", "noise": "sym50", "seed": 0, "method": "bspml",
                                                 "lambdas": [2.5, 4.0], "mus": [0.0, 30.0], "passes": 20}}
    params = validate_all(raw_params)
    layout = Layout(tmp_path)
    rng = np.random.default_rng(0)
    true = np.repeat(np.arange(6), 10)
    labels = true.copy()
    labels[::5] = (labels[::5] + 1) % 6
    emb = np.eye(8)[true] + 0.3 * rng.standard_normal((60, 8))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    run = layout.run("glyphs", "sym50", "bspml", 0)
    run.mkdir(parents=True)
    np.savez(run / TRAIN_EMBEDDINGS, embeddings=emb.astype(np.float32), labels=labels, true_labels=true,
             sample_ids=np.arange(60))
    out = bspml_map(params, "m", layout)
    table = pd.read_csv(out / "m.csv")
    assert len(table) == 4 and (out / "m.png").is_file()
    low, high = table[table["lambda"] == 2.5], table[table["lambda"] == 4.0]
    assert (high["maw"].to_numpy() >= low["maw"].to_numpy()).all()
    # the report's weight table: final mean weights of clean / noisy samples, over seeds
    per_seed = pd.DataFrame([{"dataset": "glyphs", "noise": "sym50", "method": "bspml", "seed": s,
                              "final_diag_weight_clean": 0.9 + s / 100, "final_diag_weight_noisy": 0.5}
                             for s in range(2)])
    summary = weight_summary(per_seed)
    assert summary.to_dict("records") == [{"dataset": "glyphs", "noise": "sym50", "method": "bspml",
                                           "mean weight, clean": 0.905, "mean weight, noisy": 0.5, "seeds": 2}]
    assert weight_summary(per_seed.drop(columns=["final_diag_weight_clean"])).empty


def test_bspml_table_layouts(raw_params):
    import pandas as pd

    from noisydml.tools.check import validate_all
    from noisydml.reporting.tables import summarise
    from noisydml.studies.bspml import table1 as bspml_table1, table2 as bspml_table2

    params = validate_all(raw_params)
    rows = []
    for noise, kind, rate in [("clean", "none", 0.0), ("sympc10", "symmetric_per_class", 0.1),
                              ("sympc20", "symmetric_per_class", 0.2)]:
        for method in ("ms_rho1", "bspml", "spa_confidence"):  # the last: a reference row, not a method
            for seed in (0, 1):
                value = 0.5 + 0.1 * (method == "bspml") - rate + 0.01 * seed
                rows.append({"dataset": "glyphs", "noise": noise, "noise_kind": kind, "noise_rate": rate,
                             "actual_noise_rate": rate, "method": method, "seed": seed,
                             **{f"recall_at_{k}": min(1.0, value + k / 100) for k in (1, 2, 4, 8, 16, 32)},
                             "nmi": 0.7})
    summary = summarise(pd.DataFrame(rows), [f"recall_at_{k}" for k in (1, 2, 4, 8, 16, 32)] + ["nmi"])
    t1 = "\n".join(bspml_table1(summary, params))
    assert "| method | R@1 | R@2 | R@4 | R@8 | R@16 | R@32 | NMI |" in t1
    assert "| BSPML | 61.50 ± 0.71 | 62.50 ± 0.71 |" in t1 and "sympc" not in t1  # rows by report.labels
    assert "**glyphs, clean labels**" in t1
    assert "confidence module" not in t1  # report.reference_rows never stand as methods in BSPML's layouts
    t2 = bspml_table2(summary, params["report"]["labels"], params["report"]["reference_rows"])
    assert t2[0] == "| data | NR | MS (rho=1) | BSPML |"
    assert t2[2] == "| glyphs | 10% | 41.50 ± 0.71 | 51.50 ± 0.71 |" and t2[3].startswith("| glyphs | 20% |")


def test_evaluate_carries_the_weight_histograms_into_the_runs_metrics(tmp_path, raw_params):
    import json

    import pandas as pd

    from noisydml.tools.check import validate_all
    from noisydml.pipeline.evaluate import evaluate_run
    from noisydml.pipeline.layout import Layout

    params = validate_all(raw_params)
    layout = Layout(tmp_path)
    run = layout.run("glyphs", "sym50", "bspml", 0)
    run.mkdir(parents=True)
    emb = np.eye(4)[np.repeat(np.arange(4), 3)].astype(np.float32)
    np.savez(run / "test_embeddings.npz", embeddings=emb, labels=np.repeat(np.arange(4), 3), sample_ids=np.arange(12))
    pd.DataFrame([{"epoch": 1, "loss": 0.5, "diag_weight_clean": 0.9, "diag_weight_noisy": 0.4}]).to_csv(
        run / "history.csv", index=False)
    histogram = {"edges": [0.0, 0.5, 1.0], "clean": [1, 9], "noisy": [6, 4]}
    (run / "run.json").write_text(json.dumps({"selected_epoch": 1, "model_selection": "last",
                                              "decision_histograms": {"weights": histogram}}))
    evaluate_run(params, "glyphs", "sym50", "bspml", 0, layout)
    result = json.loads(layout.metrics("glyphs", "sym50", "bspml", 0).read_text())
    assert result["method"] == "bspml" and result["training"]["histogram_weights"] == histogram
    assert result["training"]["final_diag_weight_noisy"] == 0.4


def test_weight_histograms_are_drawn_per_run_group(tmp_path):
    import pandas as pd

    from noisydml.reporting.plots import plot_weight_histograms

    h = {"edges": [0.0, 0.5, 1.0], "clean": [1, 9], "noisy": [6, 4]}
    per_seed = pd.DataFrame([{"dataset": "glyphs", "noise": n, "method": m, "seed": s, "histogram_weights": h}
                             for n in ("sym50", "sympc20") for m in ("bspml", "spms") for s in (0, 1)])
    plot_weight_histograms(per_seed, tmp_path / "w.png")
    plot_weight_histograms(per_seed.drop(columns=["histogram_weights"]), tmp_path / "none.png")
    assert (tmp_path / "w.png").stat().st_size > 1000 and (tmp_path / "none.png").is_file()


# ------------------------------------------------------------------ a direct numerical transcription (value, gradient,
# the weight update, the age schedule): each written from the paper's text, loop by loop, not from our code

def _eq7_torch(emb, labels, w, miner, alpha, beta, base):
    """Eq. 7 with product denominators (spec section 4), anchor by anchor, differentiable in ``emb``."""
    a1, p, a2, n = miner(emb.detach(), labels)
    total = emb.sum() * 0.0
    for i in range(len(emb)):
        pos, neg = p[a1 == i].tolist(), n[a2 == i].tolist()
        term = emb.sum() * 0.0
        if pos:
            s = torch.stack([emb[i] @ emb[j] for j in pos])
            term = term + sum(float(w[j]) for j in pos) / (len(pos) * alpha) * torch.log1p(
                torch.exp(-alpha * (s - base)).sum())
        if neg:
            s = torch.stack([emb[i] @ emb[j] for j in neg])
            term = term + sum(float(w[j]) for j in neg) / (len(neg) * beta) * torch.log1p(
                torch.exp(beta * (s - base)).sum())
        total = total + float(w[i]) * term
    return total / len(emb)


def test_eq7_gradient_matches_the_direct_transcription():
    emb, labels = _batch(seed=5)
    emb = emb.double()
    miner = miners.MultiSimilarityMiner(epsilon=0.1)
    w = torch.rand(len(emb), generator=torch.Generator().manual_seed(2)).double()
    ours_in, direct_in = emb.clone().requires_grad_(True), emb.clone().requires_grad_(True)
    ours = weighted_ms_loss(ours_in, labels, w, miner, 2.0, 50.0, 1.0)
    direct = _eq7_torch(direct_in, labels, w, miner, 2.0, 50.0, 1.0)
    assert ours.item() == pytest.approx(direct.item(), rel=1e-10)
    ours.backward()
    direct.backward()
    assert ours_in.grad.abs().max() > 1e-4  # a real gradient
    assert torch.allclose(ours_in.grad, direct_in.grad, rtol=1e-8, atol=1e-12)


def _alg3_literal(w0, xi_pos, xi_neg, labels, lam, mu, step_size, passes, P, K, rng):
    """Alg. 3 as the paper writes it (spec section 7), one coordinate at a time: draw w_a^c (a pass over a random
    order), K class-mates other than a, P classes other than c and K rows of each (uniform, with replacement, in
    the order rows appear), G(w_a^c) of Eq. 8 with zeta recomputed from the weights, then the projected step
    w_a <- clip(w_a - gamma N^c G, 0, 1) (gamma_c = step_size N^c, so N^c's 1/N^c cancels)."""
    w = [float(v) for v in w0]
    classes = sorted(set(labels.tolist()))
    members = {c: [i for i in range(len(labels)) if labels[i] == c] for c in classes}
    for _ in range(passes):
        for a in rng.permutation(len(w)):
            c = int(labels[a])
            mates_pool = [i for i in members[c] if i != a]
            u = rng.random((1, K))[0]
            g_p = 0.0
            if mates_pool:
                mates = [mates_pool[int(np.floor(x * len(mates_pool)))] for x in u]
                g_p = sum(w[p] * (xi_pos[p] + xi_pos[a]) for p in mates) / K
            other_classes = [k for k in classes if k != c]
            picked = [other_classes[int(np.floor(x * len(other_classes)))] for x in rng.random((1, P))[0]]
            rows = rng.random((1, P, K))[0]
            g_n = sum(sum(w[members[k][int(np.floor(x * len(members[k])))]]
                          * (xi_neg[members[k][int(np.floor(x * len(members[k])))]] + xi_neg[a]) for x in rows[j]) / K
                      for j, k in enumerate(picked)) / P
            means = {k: sum(w[i] for i in members[k]) / len(members[k]) for k in classes}
            g_b = 2 * mu * (means[c] - sum(means[k] for k in other_classes) / len(other_classes))
            w[a] = min(max(w[a] - step_size * (g_p + g_n + g_b - lam), 0.0), 1.0)
    return np.array(w)


def test_alg3_weight_step_matches_the_literal_algorithm_with_the_same_draws():
    """block 1 is the paper's sequential loop: the same random draws give the same weights as the literal Alg. 3,
    on uneven classes (one of a single row) with the balance term on."""
    rng = np.random.default_rng(11)
    labels = np.array([0] * 5 + [1] * 3 + [2] * 6 + [3] * 1 + [4] * 4)
    xi_pos, xi_neg = rng.uniform(1, 3, len(labels)), rng.uniform(0, 0.6, len(labels))
    w0 = rng.uniform(0.2, 1.0, len(labels))
    for lam, mu in ((2.5, 3.1), (1.0, 0.0)):
        ours = weight_step(w0, xi_pos, xi_neg, ClassIndex.of(labels), lam, mu, 0.05, 3, 3, 4, 1,
                           np.random.default_rng(5))
        literal = _alg3_literal(w0, xi_pos, xi_neg, labels, lam, mu, 0.05, 3, 3, 4, np.random.default_rng(5))
        assert np.abs(ours - w0).max() > 0.01  # the weights moved: the comparison is not trivial
        assert np.allclose(ours, literal, rtol=0, atol=1e-12), np.abs(ours - literal).max()


def test_the_age_follows_alg1_round_by_round(monkeypatch):
    """Alg. 1: the first round trains with w = 1, round t's weight step uses lambda^{t-1} (lambda^0 first), then
    lambda^t = min(c lambda^{t-1}, lambda_inf)."""
    from types import SimpleNamespace

    import noisydml.methods.parts.bspml as bspml_module
    from noisydml.methods.base import MethodSetup
    from noisydml.methods.parts.bspml import bspml_spec

    spec = bspml_spec(True)
    hp = spec.check({"lambda_0": 2.0, "lambda_inf": 3.0, "age_multiplier": 1.2, "epochs_per_round": 2,
                     "weight_step": {"passes": 1, "block": 4}}, "methods.bspml")
    emb, labels = _batch(classes=4, per_class=4)
    method = spec.build(MethodSetup(hp, 4, emb.shape[1], len(labels), labels.numpy(), seed=0))
    assert torch.equal(method.weights, torch.ones(len(labels), dtype=torch.float64))  # round 1: w = 1
    used = []
    real = bspml_module.weight_step
    monkeypatch.setattr(bspml_module, "weight_step", lambda w, xp, xn, index, lam, *a, **k: used.append(lam) or
                        real(w, xp, xn, index, lam, *a, **k))
    ctx = SimpleNamespace(embed_train=lambda: emb.numpy(), similarity_blocks=similarity_blocks, knn=knn)
    for epoch in range(10):
        ctx.epoch = epoch
        method.on_epoch_end(ctx)
    expected, lam = [], 2.0
    for _ in range(5):  # a weight step after every second epoch
        expected.append(lam)
        lam = min(1.2 * lam, 3.0)
    assert used == pytest.approx(expected) and expected[-1] == 3.0 and expected[1] == pytest.approx(2.4)
    assert float(method.age) == pytest.approx(3.0) and int(method.rounds) == 5


def test_the_exact_gradient_is_eq6s_derivative():
    """exact_gradient (class sums) equals torch's derivative of the direct Eq. 6, on uneven classes (one of a single
    row) with the balance term on."""
    labels = np.array([0] * 5 + [1] * 3 + [2] * 4 + [3] * 6 + [4] * 1)
    xi_pos, xi_neg, w0, lam, mu, exact = _eq6_gradient_problem(labels, seed=4)
    index = ClassIndex.of(labels)
    sums = tuple(np.bincount(labels, weights=v) for v in (w0, w0 * xi_pos, w0 * xi_neg))
    ours = exact_gradient(np.arange(len(labels)), w0, sums, xi_pos, xi_neg, index, lam, mu) / index.count[labels]
    assert np.allclose(ours, exact, rtol=0, atol=1e-12), np.abs(ours - exact).max()


def test_the_exact_weight_step_settles_within_its_tolerance_and_the_sampled_one_does_not():
    labels, xi_pos, xi_neg = _fixed_xi_problem()
    index = ClassIndex.of(labels)
    exact, sampled = [], []
    w = weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, 2.5, 2.5, 0.3, 2000, 4, 4, 16,
                    np.random.default_rng(0), tolerance=1e-6, trace=exact, gradient="exact")
    assert len(exact) < 2000 and exact[-1] <= 1e-6
    # a stationary point of Eq. 6 on the box (its KKT conditions): no descent direction is left at any coordinate
    sums = tuple(np.bincount(labels, weights=v) for v in (w, w * xi_pos, w * xi_neg))
    g = exact_gradient(np.arange(len(w)), w, sums, xi_pos, xi_neg, index, 2.5, 2.5)
    inside = (w > 0) & (w < 1)
    assert inside.any() or ((w == 0).any() and (w == 1).any())
    assert np.abs(g[inside]).max(initial=0) < 1e-4 and (g[w == 0] >= -1e-4).all() and (g[w == 1] <= 1e-4).all()
    weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, 2.5, 2.5, 0.3, 200, 4, 4, 16, np.random.default_rng(0),
                tolerance=1e-6, trace=sampled, gradient="sampled")
    assert len(sampled) == 200 and min(sampled[-20:]) > 1e-3  # Eq. 8's noise keeps it moving at a constant step
    with pytest.raises(ValueError, match="allowed: sampled, exact"):
        weight_step(np.ones(len(labels)), xi_pos, xi_neg, index, 2.5, 2.5, 0.3, 1, 4, 4, 16,
                    np.random.default_rng(0), gradient="newton")


def test_the_age_unit_is_the_log_of_the_mean_class_size():
    labels = np.repeat(np.arange(10), 20)
    assert age_unit("absolute", labels, 2.0) == 1.0
    assert age_unit("log_class_size", labels, 2.0) == pytest.approx(np.log(20.0))
    assert age_unit("log_class_size", labels, 4.0) == pytest.approx(0.5 * np.log(20.0))
    # the same relative age on 32-image classes is larger by log 32 / log 20
    big = np.repeat(np.arange(10), 32)
    assert age_unit("log_class_size", big, 2.0) / age_unit("log_class_size", labels, 2.0) == pytest.approx(
        np.log(32) / np.log(20))
