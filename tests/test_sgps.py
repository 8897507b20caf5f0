"""SGPS (methods/parts/sgm.py, methods/parts/sgps.py) on small hand-made feature sets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import grouped_sgps_state
import torch.nn.functional as F

from noisydml.engine.judge import GroundTruth, score_decisions
from noisydml.methods.base import Batch, Decisions, MethodSetup
from noisydml.methods.parts.sgm import (
    Subgroups, bottom_up, intra_class_nearest, intra_class_subgroups, run_sgm, sgm_sizes, similarity_thresholds, top_down,
    unit_rows,
)
from noisydml.methods.parts.pml import MCL
from noisydml.methods.parts.sgps import (
    SGM_SCHEMA, TRANSPROTO_SCHEMA, SgpsMethod, TransProto, ppm_max, ppm_mean, ppm_softmax, sgps_spec,
)
from noisydml.schema import ParamsError


def _unit(*angles_deg):
    a = np.radians(np.asarray(angles_deg, dtype=float))
    return np.stack([np.cos(a), np.sin(a)], 1).astype(np.float32)


# ---------------------------------------------------------------- Alg. 1


def test_intra_class_components_outliers_and_meta_clusters():
    # class 0: a tight trio (0, 1, 2), a pair (3, 4) far from it, an outlier (5); class 1: two rows
    feats = _unit(0, 5, 10, 90, 95, 200, 45, 47)
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    g = intra_class_subgroups(feats, labels, lambda_max=0.99, lambda_min=0.9)
    sub = g.subgroup
    assert sub[0] == sub[1] == sub[2] and sub[3] == sub[4] and len({sub[0], sub[3], sub[5]}) == 3
    assert sub[6] == sub[7] and sub[6] not in (sub[0], sub[3], sub[5])  # components never cross classes
    assert g.size[sub[5]] == 1  # the outlier is a singleton subgroup, still in play
    assert g.meta[sub[0]] and not g.meta[sub[3]] and not g.meta[sub[5]] and g.meta[sub[6]]
    assert g.meta.sum() == 2 and np.array_equal(g.subgroup_class[sub], labels)
    # the 1-NN link alone joins rows above lambda_min, even below lambda_max
    g2 = intra_class_subgroups(_unit(0, 20, 40), np.zeros(3, int), lambda_max=0.99, lambda_min=0.5)
    assert len(set(g2.subgroup)) == 1
    with pytest.raises(ValueError, match="lambda_min"):
        intra_class_subgroups(feats, labels, lambda_max=0.5, lambda_min=0.6)


def test_meta_cluster_ties_take_the_lowest_subgroup_and_blocks_change_nothing():
    feats = _unit(0, 2, 90, 92)
    g = intra_class_subgroups(feats, np.zeros(4, int), 0.99, 0.9)
    assert g.meta.tolist() == [True, False]
    rng = np.random.default_rng(0)
    many = unit_rows(rng.normal(size=(300, 8))).astype(np.float32)
    labels = rng.integers(0, 3, 300)
    a = intra_class_subgroups(many, labels, 0.5, 0.2)
    b = intra_class_subgroups(many, labels, 0.5, 0.2, block_rows=7)
    assert np.array_equal(a.subgroup, b.subgroup) and np.array_equal(a.meta, b.meta)


# ---------------------------------------------------------------- Alg. 2


def _groups(sizes, meta, dim=6, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), dim))
    sub = np.repeat(np.arange(len(sizes)), sizes)
    feats = unit_rows(centres[sub] + 0.3 * rng.normal(size=(len(sub), dim))).astype(np.float32)
    return feats, Subgroups(sub, np.arange(len(sizes)), np.asarray(sizes), np.asarray(meta, bool))


def _bottom_up_direct(feats, g, tau_k, tau_max, min_sim, meta_sim):
    """Alg. 2 transcribed: the best pair of all (ties: lowest ids), the rules, a rejected pair ignored."""
    sums = {i: feats[g.subgroup == i].astype(np.float64).sum(0) for i in range(g.count)}
    size = {i: int(g.size[i]) for i in range(g.count)}
    meta = {i: bool(g.meta[i]) for i in range(g.count)}
    members = {i: {i} for i in range(g.count)}
    ignored = set()
    while len(sums) > tau_k:
        best = None
        for i in sorted(sums):
            for j in sorted(sums):
                if i < j and (i, j) not in ignored:
                    s = float(unit_rows(sums[i][None])[0] @ unit_rows(sums[j][None])[0])
                    if best is None or s > best[0]:
                        best = (s, i, j)
        if best is None or best[0] < min_sim:
            break
        s, i, j = best
        if (meta[i] and meta[j] and not s > meta_sim) or size[i] + size[j] > tau_max:
            ignored.add((i, j))
            continue
        sums[i] += sums.pop(j)
        size[i] += size.pop(j)
        meta[i] = meta[i] or meta.pop(j)
        members[i] |= members.pop(j)
        ignored = {(a, b) for a, b in ignored if i not in (a, b) and j not in (a, b)}
    label = {m: root for root, ms in members.items() for m in ms}
    return np.unique([label[s] for s in g.subgroup], return_inverse=True)[1]


@pytest.mark.parametrize("tau_k, tau_max, min_sim", [(1, 100, -1.0), (4, 100, -1.0), (1, 9, -1.0), (1, 100, 0.3)])
def test_bottom_up_is_alg2_exactly_with_a_full_candidate_graph(tau_k, tau_max, min_sim):
    feats, g = _groups([3, 5, 2, 4, 1, 1, 6, 2, 3, 1], [1, 1, 0, 1, 0, 0, 0, 0, 0, 0], seed=3)
    got, stats = bottom_up(feats, g, tau_k, tau_max, min_sim, neighbours=g.count - 1)
    want = _bottom_up_direct(feats, g, tau_k, tau_max, min_sim, 1.0)
    assert np.array_equal(got, want)
    assert stats["rejected_meta"] > 0 or tau_k > 1


def test_bottom_up_rules_meta_never_merge_size_bound_and_stop_count():
    feats, g = _groups([4, 4, 1, 1, 1, 2, 3], [1, 1, 0, 0, 0, 0, 0], seed=1)
    cb, _ = bottom_up(feats, g, tau_k=1, tau_max=6, min_similarity=-1.0, neighbours=g.count - 1)
    roots = {}
    for sub, lab in zip(g.subgroup, cb):
        roots.setdefault(lab, set()).add(sub)
    for subs in roots.values():
        assert sum(g.meta[list(subs)]) <= 1  # two meta clusters never share a group (A9: a merge inherits meta)
        if len(subs) > 1:
            assert g.size[list(subs)].sum() <= 6  # no merge beyond tau_max
    big, _ = _groups([9, 1, 1], [0, 0, 0])
    assert bottom_up(big, _groups([9, 1, 1], [0, 0, 0])[1], 1, 5, -1.0, neighbours=2)[0].tolist()[:9] == [0] * 9  # an initial subgroup above tau_max stays
    cb4, _ = bottom_up(feats, g, tau_k=5, tau_max=100, min_similarity=-1.0, meta_merge_similarity=-1.0)
    assert len(np.unique(cb4)) == 5  # stops at tau_k groups, not below (A11)
    cb_all, _ = bottom_up(feats, g, tau_k=1, tau_max=100, min_similarity=-1.0, meta_merge_similarity=-1.0)
    assert len(np.unique(cb_all)) == 1  # lambda'_max below every similarity lets meta clusters merge


# ---------------------------------------------------------------- Algs. 3-4


def test_top_down_cells_follow_the_b_rule_and_terminate_on_identical_centroids():
    feats, g = _groups([5, 1, 2, 7, 3, 1, 4, 2], [1, 0, 0, 1, 0, 0, 1, 0], seed=2)
    for cell_size in (2, 4, 8, 100):
        ct = top_down(feats, g, cell_size, np.random.default_rng(0))
        assert len(ct) == len(feats)
        for cell in np.unique(ct):
            subs = np.unique(g.subgroup[ct == cell])
            assert (ct == cell).sum() < cell_size or len(subs) == 1  # a single subgroup may exceed B
            assert np.all(np.isin(g.subgroup[np.isin(g.subgroup, subs)], subs))  # subgroups are never split
        assert np.array_equal(ct, top_down(feats, g, cell_size, np.random.default_rng(0)))  # seeded
    same = np.tile(_unit(10), (6, 1))
    gs = Subgroups(np.arange(6), np.arange(6), np.ones(6, int), np.zeros(6, bool))
    assert len(np.unique(top_down(same, gs, 2, np.random.default_rng(0)))) == 6  # A16: still terminates


def test_every_row_gets_one_bottom_up_and_one_top_down_label():
    rng = np.random.default_rng(4)
    feats = unit_rows(rng.normal(size=(120, 8))).astype(np.float32)
    labels = rng.integers(0, 6, 120)
    cfg = {k: f.default for k, f in SGM_SCHEMA.items()} | {"lambda_max": 0.5, "lambda_min": 0.1}
    r = run_sgm(feats, labels, cfg, np.random.default_rng(0))
    for lab in (r.bottom_up, r.top_down):
        assert lab.shape == (120,) and lab.min() == 0 and np.array_equal(np.unique(lab), np.arange(lab.max() + 1))
    assert sgm_sizes(cfg, 120, 6) == (6, 40, 40)


# ---------------------------------------------------------------- PPM and L_noise


def test_prototypes_match_their_formulas():
    g = torch.Generator().manual_seed(0)
    pos = F.normalize(torch.randn(3, 4, 8, generator=g), dim=2)
    anchors = F.normalize(torch.randn(3, 8, generator=g), dim=1)
    assert torch.allclose(ppm_mean(pos), F.normalize(pos.mean(1), dim=1))
    for a in range(3):
        best = int(torch.argmax(pos[a] @ anchors[a]))
        assert torch.allclose(ppm_max(pos, anchors)[a], pos[a, best])
        corr = pos[a] @ pos[a].T - torch.eye(4)
        w = torch.softmax(corr @ torch.ones(4) / 4, dim=0)
        assert torch.allclose(ppm_softmax(pos)[a], F.normalize(w @ pos[a], dim=0), atol=1e-6)
    tp = TransProto(8, layers=3, heads=4, ffn_factor=2)
    cond = F.normalize(torch.randn(3, 5, 8, generator=g), dim=2)
    assert torch.allclose(tp(pos, cond), ppm_mean(pos), atol=1e-6)  # zeroed residual branches: the normalised Mean
    with pytest.raises(ParamsError, match="heads"):
        TransProto(10, 3, 4, 2)


def _method(n=12, dim=4, **hp):
    spec = sgps_spec(MCL, "test")
    params = {"memory_size": 16, "noise_rate": 0.5, "window": 1, "sgm": {}, "transproto": {}, **hp}
    hparams = spec.check(params, "methods.sgps")
    labels = np.repeat(np.arange(3), n // 3)
    return SgpsMethod(MethodSetup(hparams, 3, dim, n, labels, seed=0), MCL), labels


def test_l_noise_matches_a_direct_computation_of_eqs_13_to_16():
    m, labels = _method(gamma_batch=1.0, gamma_bank=0.5, temperature=0.1, margin=0.2, ppm="mean")
    g = torch.Generator().manual_seed(1)
    m.bank.copy_(F.normalize(torch.randn(12, 4, generator=g), dim=1))
    m.bottom_up_labels.copy_(torch.tensor([0, 0, 1, 1, 2, 2, 0, 3, 3, 4, 4, 4]))
    m.top_down_labels.copy_(torch.tensor([0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 0]))
    m.sgm_round.fill_(1)
    m._set_pools()
    mem = F.normalize(torch.randn(5, 4, generator=g), dim=1)
    m.memory.enqueue(mem, torch.tensor([0, 1, 2, 2, 1]), torch.tensor([0, 4, 8, 9, 5]))
    index = torch.tensor([0, 3, 6, 9])
    emb = F.normalize(torch.randn(4, 4, generator=g), dim=1).requires_grad_(True)
    batch = Batch(emb, emb, torch.as_tensor(labels[index.numpy()]), index, index, step=7, epoch=0)
    keep = torch.tensor([True, False, True, False])
    value, logs = m.noise_loss(batch, keep)
    pos, _ = m.draw_positives(np.array([3, 9]), 7)
    cb, ct = m.bottom_up_labels.numpy(), m.top_down_labels.numpy()
    total_batch, total_bank = 0.0, 0.0
    for a, r in zip([1, 3], [3, 9]):
        z = emb[a].detach()
        pool = set(np.flatnonzero((cb == cb[r]) | (ct == ct[r])).tolist()) - {r}
        assert set(pos[[1, 3].index(a)].tolist()) <= pool
        proto = F.normalize(torch.stack([m.bank[j] for j in pos[[1, 3].index(a)]]).mean(0), dim=0)
        p = (float(z @ proto) - 0.2) / 0.1
        negs = [float(z @ emb[j].detach()) / 0.1 for j, rj in enumerate(index.tolist())
                if labels[rj] != labels[r] and cb[rj] != cb[r] and ct[rj] != ct[r]]
        total_batch += -p + np.log(np.exp(p) + sum(np.exp(v) for v in negs))
        mem_rows, mem_labels = [0, 4, 8, 9, 5], [0, 1, 2, 2, 1]
        negs = [float(z @ mem[j]) / 0.1 for j, (rj, lj) in enumerate(zip(mem_rows, mem_labels))
                if lj != labels[r] and cb[rj] != cb[r] and ct[rj] != ct[r]]
        total_bank += -p + np.log(np.exp(p) + sum(np.exp(v) for v in negs))
    assert value.item() == pytest.approx(total_batch / 2 + 0.5 * total_bank / 2, rel=1e-5)
    assert logs["sgps_anchor_fraction"] == 0.5 and logs["sgps_anchors_with_positives"] == 1.0
    value.backward()
    assert emb.grad is not None and emb.grad[1].abs().sum() > 0




@pytest.mark.parametrize("positives, negatives, conditions", [
    ("both", "positives", ("b", "t")), ("bottom_up", "positives", ("b",)), ("top_down", "positives", ("t",)),
    ("bottom_up", "both", ("b", "t")), ("top_down", "both", ("b", "t"))])
def test_the_negative_mask_follows_its_own_rule_apart_from_the_positives(positives, negatives, conditions):
    """Eq. 14: a negative's noisy label differs and, for each labelling the rule names, its c^B / c^T differ too:
    those of the positives (A19) or, with ``negatives: both``, c^B and c^T whatever side the positives come from,
    so that Fig. 5a's one-side runs can be compared at the same mask. The pools still follow ``positives``."""
    m, labels = _method(positives=positives, negatives=negatives)
    m.bottom_up_labels.copy_(torch.tensor([0, 0, 1, 1, 2, 2, 0, 3, 3, 4, 4, 4]))
    m.top_down_labels.copy_(torch.tensor([0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 0]))
    cb, ct = m.bottom_up_labels.numpy(), m.top_down_labels.numpy()
    rows = torch.arange(12)
    mask = m._negative_mask(rows, torch.as_tensor(labels), rows, torch.as_tensor(labels)).numpy()
    expected = labels[:, None] != labels[None, :]
    if "b" in conditions:
        expected &= cb[:, None] != cb[None, :]
    if "t" in conditions:
        expected &= ct[:, None] != ct[None, :]
    assert np.array_equal(mask, expected)
    assert m._masks()[1] == ("t" in conditions)  # SGM computes c^T when the mask needs it (it covers the pools')
    m.sgm_round.fill_(1)
    m._set_pools()
    assert set(m.decisions().groups) == {"bottom_up": {"bottom_up"}, "top_down": {"top_down"},
                                         "both": {"bottom_up", "top_down"}}[positives]


def test_forwarded_positives_are_drawn_for_every_item_and_carry_the_gradient():
    """positive_source forward (the authors' loader): K positives per batch item asked before the forward; the
    rejected items' prototypes are built from those rows' forwarded embeddings, not the bank, with gradient."""
    m, labels = _method(gamma_batch=1.0, gamma_bank=0.0, temperature=0.1, margin=0.2, ppm="mean",
                        positives_per_sample=3, positive_source="forward")
    rows = np.array([0, 3, 6, 9])
    m.sgm_round.fill_(0)
    assert m.extra_samples(rows, 0, 7) is None  # no subgroups yet: nothing extra
    g = grouped_sgps_state(m)
    request = m.extra_samples(rows, 1, 7)  # the rows, and what was drawn with them (back on batch.extra)
    extra_rows = request.rows
    drawn, _ = m.draw_positives(rows, 7)
    assert extra_rows.shape == (12,) and np.array_equal(extra_rows, drawn.reshape(-1))  # every item has candidates
    index = torch.as_tensor(rows)
    emb = F.normalize(torch.randn(4, 4, generator=g), dim=1).requires_grad_(True)
    extra_emb = F.normalize(torch.randn(12, 4, generator=g), dim=1).requires_grad_(True)  # not the bank's
    extra_index = torch.as_tensor(extra_rows)
    extra = Batch(extra_emb, extra_emb, torch.as_tensor(labels[extra_rows]), extra_index, extra_index, 7, 1,
                  request=request)
    batch = Batch(emb, emb, torch.as_tensor(labels[rows]), index, index, step=7, epoch=1, extra=extra)
    keep = torch.tensor([True, False, True, False])
    value, _ = m.noise_loss(batch, keep)
    cb, ct = m.bottom_up_labels.numpy(), m.top_down_labels.numpy()
    total = 0.0
    for a in (1, 3):
        r, z = rows[a], emb[a].detach()
        proto = F.normalize(extra_emb[3 * a:3 * a + 3].detach().mean(0), dim=0)
        p = (float(z @ proto) - 0.2) / 0.1
        negs = [float(z @ emb[j].detach()) / 0.1 for j, rj in enumerate(rows)
                if labels[rj] != labels[r] and cb[rj] != cb[r] and ct[rj] != ct[r]]
        total += -p + np.log(np.exp(p) + sum(np.exp(v) for v in negs))
    assert value.item() == pytest.approx(total / 2, rel=1e-5)
    assert np.array_equal(m.drawn[torch.as_tensor(rows[[1, 3]])].numpy(), drawn[[1, 3]])
    value.backward()
    moved = extra_emb.grad.abs().sum(1).reshape(4, 3).sum(1)
    assert (moved[[1, 3]] > 0).all() and (moved[[0, 2]] == 0).all()  # only the rejected items' positives
    # a batch without the rows extra_samples asked for is refused, not silently read from the bank
    with pytest.raises(RuntimeError, match="extra_samples"):
        m.noise_loss(Batch(emb, emb, batch.labels, index, index, step=7, epoch=1), keep)


def test_feature_bank_momentum_weights_the_new_feature():
    m, labels = _method(bank_momentum=0.9)
    old = F.normalize(torch.tensor([[1.0, 0, 0, 0]]), dim=1)
    new = torch.tensor([[0.0, 1, 0, 0]])
    m.bank[2] = old[0]
    m._update_bank(Batch(new, new, torch.tensor([0]), torch.tensor([2]), torch.tensor([2]), 0, 0))
    assert torch.allclose(m.bank[2], F.normalize(torch.tensor([0.1, 0.9, 0, 0]), dim=0))


def test_the_judge_scores_groups_and_positives_against_the_truth():
    truth = GroundTruth(np.array([0, 0, 1, 0, 1, 0], bool), np.array([0, 0, 0, 1, 1, 1]), np.ones(6, bool))
    groups = {"bottom_up": np.array([0, 0, 0, 1, 1, 2])}
    positives = np.array([[-1, -1], [-1, -1], [0, 3], [-1, -1], [3, 5], [-1, -1]])
    s = score_decisions(Decisions(groups=groups, positives=positives), truth)
    assert s["diag_groups_bottom_up"] == 3 and s["diag_purity_bottom_up"] == pytest.approx(6 / 6)
    assert s["diag_pool_true_positive"] == 1.0 and s["diag_pool_nonempty"] == 1.0
    assert s["diag_positive_precision"] == pytest.approx(3 / 4) and s["diag_anchor_true_positive"] == 1.0
    # open-set noise: a noisy row of a dissolved class (true label -1) has no true positive to find
    open_set = GroundTruth(truth.is_noisy, np.array([0, 0, -1, 1, -1, 1]), truth.known)
    s = score_decisions(Decisions(groups=groups), open_set)
    assert "diag_pool_true_positive" not in s and s["diag_purity_bottom_up"] == 1.0


def test_params_are_checked_across_keys():
    spec = sgps_spec(MCL, "test")
    with pytest.raises(ParamsError, match="lambda_min"):
        spec.check({"sgm": {"lambda_max": 0.5, "lambda_min": 0.6}}, "methods.sgps")
    with pytest.raises(ParamsError, match="noise_rate"):
        spec.check({"noise_rate": 0.0}, "methods.sgps")
    with pytest.raises(ParamsError, match="ppm"):
        spec.check({"ppm": "median"}, "methods.sgps")
    assert set(spec.check({}, "x")["transproto"]) == set(TRANSPROTO_SCHEMA)


def test_group_majorities_match_a_crosstab_without_building_one():
    import pandas as pd

    from noisydml.engine.judge import group_majorities

    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 200))
        groups, classes = rng.integers(0, 30, n), rng.integers(-1, 8, n)
        majority, count = group_majorities(groups, classes, num_groups=32)
        table = pd.crosstab(groups, classes)
        for g in range(32):
            expected = (table.loc[g].idxmax(), table.loc[g].max()) if g in table.index else (-1, 0)
            assert (majority[g], count[g]) == expected  # ties: the lowest class


def test_the_study_sets_each_clean_loss_beside_sgps_around_it_per_seed():
    from noisydml.studies.sgps import clean_loss_pairs

    rows = []
    for seed in (0, 1):
        for method, p1 in (("roadmap", 0.50), ("sgps_roadmap", 0.55), ("contextual", 0.40), ("mcl", 0.3)):
            rows.append({"dataset": "glyphs", "noise": "sym50", "method": method, "seed": seed, "run_kind": "grid",
                         "precision_at_1": p1 + seed / 100, "mean_average_precision_at_r": p1 / 2,
                         "final_diag_kept_fraction": 0.5 if method.startswith("sgps") else None})
    rows.append({"dataset": "glyphs", "noise": "sym50", "method": "sgps_contextual", "seed": 1, "run_kind": "grid",
                 "precision_at_1": 0.35, "mean_average_precision_at_r": 0.2, "final_diag_kept_fraction": 0.6})
    pairs = clean_loss_pairs(pd.DataFrame(rows))
    # roadmap at both seeds; contextual only at the seed its SGPS ran; mcl without sgps: no pair
    assert [(r["clean loss"], r["seed"]) for r in pairs.to_dict("records")] == [("roadmap", 0), ("roadmap", 1),
                                                                                 ("contextual", 1)]
    assert pairs["P@1 diff"].round(6).tolist() == [0.05, 0.05, -0.06]
    assert pairs["kept"].tolist() == [0.5, 0.5, 0.6]


# ---------------------------------------------------------------- the authors' training-loop options (authors.*)

def _forwarded_batch(m, labels, g, rows=(0, 3, 6, 9), step=7):
    """A batch of ``rows`` with their forwarded positives (K = 3 each), as the trainer hands it over."""
    rows = np.asarray(rows)
    request = m.extra_samples(rows, 1, step)
    extra_rows = request.rows
    index, extra_index = torch.as_tensor(rows), torch.as_tensor(extra_rows)
    emb = F.normalize(torch.randn(len(rows), 4, generator=g), dim=1).requires_grad_(True)
    extra_emb = F.normalize(torch.randn(len(extra_rows), 4, generator=g), dim=1).requires_grad_(True)
    extra = Batch(extra_emb, extra_emb, torch.as_tensor(labels[extra_rows]), extra_index, extra_index, step, 1,
                  request=request)
    return Batch(emb, emb, torch.as_tensor(labels[rows]), index, index, step=step, epoch=1, extra=extra)


def _p_clean_direct(memory_features, memory_labels, embeddings, labels, classes=3):
    """Eqs. 6-7 by hand: each class centre the mean of its memory features; softmax over classes at the label."""
    centres = np.stack([memory_features[memory_labels == c].mean(0) for c in range(classes)])
    logits = F.normalize(embeddings, dim=1).detach().numpy() @ centres.T
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return p[np.arange(len(labels)), labels]


def test_selection_on_all_ranks_every_forwarded_image_into_the_queries_window():
    """authors.selection_on_all (the authors' second PCS call): the query call's Q_t, then one over the queries and
    their positives, both into one window; L_noise's anchors are the queries the second call rejects; only the
    query call's kept rows are enqueued."""
    m, labels = _method(gamma_batch=1.0, gamma_bank=0.0, temperature=0.1, margin=0.2, ppm="mean", window=2,
                        positives_per_sample=3, positive_source="forward", authors={"selection_on_all": True})
    g = grouped_sgps_state(m)
    mem = F.normalize(torch.randn(9, 4, generator=g), dim=1)
    mem_labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2])
    m.memory.enqueue(mem, torch.as_tensor(mem_labels), torch.arange(9))
    batch = _forwarded_batch(m, labels, g)
    images = torch.cat([batch.embeddings, batch.extra.embeddings])
    image_labels = torch.cat([batch.labels, batch.extra.labels]).numpy()
    p_queries = _p_clean_direct(mem.numpy(), mem_labels, batch.embeddings, batch.labels.numpy())
    p_all = _p_clean_direct(mem.numpy(), mem_labels, images, image_labels)
    q1, q2 = np.sort(p_queries)[2 - 1], np.sort(p_all)[8 - 1]  # floor(R n)-th lowest, R = 0.5
    anchors = np.flatnonzero(~(p_all[:4] > (q1 + q2) / 2))    # the queries the second call rejects
    assert 0 < len(anchors) < 4 and not np.array_equal(anchors, np.flatnonzero(~(p_queries > q1)))
    kept_queries = int((p_queries > q1).sum())
    _, logs = m.loss(batch)
    assert int(m.threshold.count) == 2
    assert np.allclose(m.threshold.values.numpy(), [q1, q2], atol=1e-6)
    assert logs["sgps_anchor_fraction"] == pytest.approx(len(anchors) / 4)
    assert np.array_equal(np.flatnonzero((m.drawn[batch.index] >= 0).all(1).numpy()), anchors)
    assert int((m.memory.labels >= 0).sum()) == 9 + kept_queries  # the second call enqueues nothing


def test_clean_loss_on_all_is_the_contrastive_loss_of_the_kept_images_against_the_memory_without_enqueueing():
    """authors.clean_loss_on_all's term: pml's contrastive loss (pos 1 - s, neg relu(s - 0.5), the means of the
    non-zero ones) over the kept images against each other (no self pair) and the memory of earlier steps."""
    from noisydml.methods.parts.sgps import clean_loss_without_enqueue

    m, _ = _method(loss={"pos_margin": 1.0, "neg_margin": 0.5})
    g = torch.Generator().manual_seed(4)
    mem = F.normalize(torch.randn(6, 4, generator=g), dim=1)
    mem_labels = torch.tensor([0, 1, 2, 0, 1, 2])
    m.base.loss_fn(mem, mem_labels)  # XBM enqueues a first batch
    queue = int(m.base.loss_fn.queue_idx)
    emb = F.normalize(torch.randn(5, 4, generator=g), dim=1).requires_grad_(True)
    lab = torch.tensor([0, 0, 1, 2, 1])
    value = clean_loss_without_enqueue(m.base, emb, lab, step=3, batch_size=5)
    ref, ref_lab = torch.cat([emb.detach(), mem]).numpy(), torch.cat([lab, mem_labels]).numpy()
    s = emb.detach().numpy() @ ref.T
    pos, neg = [], []
    for i in range(5):
        for j in range(len(ref)):
            if j == i:
                continue
            (pos if lab[i] == ref_lab[j] else neg).append(max(1.0 - s[i, j], 0.0) if lab[i] == ref_lab[j]
                                                          else max(s[i, j] - 0.5, 0.0))
    direct = np.mean([v for v in pos if v > 0]) + np.mean([v for v in neg if v > 0])
    assert value.item() == pytest.approx(direct, rel=1e-5)
    assert int(m.base.loss_fn.queue_idx) == queue  # nothing enqueued
    value.backward()
    assert emb.grad.abs().sum() > 0


def test_clean_loss_on_all_adds_the_second_clean_term_to_the_noise_loss():
    kw = dict(gamma_batch=1.0, gamma_bank=0.0, temperature=0.1, margin=0.2, ppm="mean", window=2,
              positives_per_sample=3, positive_source="forward")
    from noisydml.methods.parts.sgps import clean_loss_without_enqueue

    values = {}
    for name, authors in (("select", {"selection_on_all": True}),
                          ("both", {"selection_on_all": True, "clean_loss_on_all": True})):
        m, labels = _method(**kw, authors=authors)
        g = grouped_sgps_state(m)
        m.memory.enqueue(F.normalize(torch.randn(9, 4, generator=g), dim=1), torch.as_tensor([0, 1, 2] * 3),
                         torch.arange(9))
        batch = _forwarded_batch(m, labels, g)
        values[name] = m.noise_loss(batch, torch.ones(4, dtype=torch.bool))
        if name == "both":  # the same second selection (the window restarted) gives the kept images
            m.threshold.count.zero_()
            m.threshold.values.zero_()
            images = torch.cat([batch.embeddings, batch.extra.embeddings])
            image_labels = torch.cat([batch.labels, batch.extra.labels])
            kept = m.select(images, image_labels, batch.step)
            term = clean_loss_without_enqueue(m.base, images[kept], image_labels[kept], 7, len(images))
    (select_value, _), (both_value, logs) = values["select"], values["both"]
    assert both_value.item() == pytest.approx(select_value.item() + term.item(), rel=1e-5)
    assert logs["sgps_clean_all"] == pytest.approx(term.item(), rel=1e-5)


def test_positives_update_bank_refreshes_each_forwarded_row_once_after_the_batch_rows():
    m, labels = _method(positives_per_sample=3, positive_source="forward", bank_momentum=0.9,
                        authors={"positives_update_bank": True})
    g = grouped_sgps_state(m)
    before = m.bank.clone()
    batch = _forwarded_batch(m, labels, g)
    m._update_bank(batch)
    expected = before.clone()
    rows, extra_rows = batch.index.numpy(), batch.extra.index.numpy()
    for position, row in enumerate(rows):
        expected[row] = F.normalize(0.9 * batch.embeddings[position].detach() + 0.1 * before[row], dim=0)
    seen = set(rows.tolist())
    for position, row in enumerate(extra_rows):
        if row in seen:
            continue
        seen.add(row)
        expected[row] = F.normalize(0.9 * batch.extra.embeddings[position].detach() + 0.1 * before[row], dim=0)
    assert torch.allclose(m.bank, expected, atol=1e-6)
    assert len(set(extra_rows.tolist()) - set(rows.tolist())) > 0  # the case is not empty
    off, _ = _method(positives_per_sample=3, positive_source="forward", bank_momentum=0.9)
    grouped_sgps_state(off)
    off._update_bank(batch)
    untouched = sorted(set(extra_rows.tolist()) - set(rows.tolist()))
    assert torch.equal(off.bank[untouched], before[untouched])  # off: only the batch's rows


def test_the_authors_options_are_refused_where_they_cannot_apply():
    spec = sgps_spec(MCL, "test")
    with pytest.raises(ParamsError, match=r"authors.selection_on_all.*positive_source"):
        spec.check({"authors": {"selection_on_all": True}}, "methods.sgps")
    with pytest.raises(ParamsError, match=r"authors.positives_update_bank.*positive_source"):
        spec.check({"authors": {"positives_update_bank": True}}, "methods.sgps")
    with pytest.raises(ParamsError, match=r"clean_loss_on_all.*selection_on_all"):
        spec.check({"positive_source": "forward", "authors": {"clean_loss_on_all": True}}, "methods.sgps")


def test_quantile_thresholds_follow_the_intra_class_nearest_neighbour_similarities():
    """thresholds: quantile turns each level into that quantile of the rows' similarity to their most similar
    class-mate (noisy labels, self excluded, a lone row left out); absolute keeps the values; run_sgm logs them."""
    rng = np.random.default_rng(0)
    feats = unit_rows(rng.standard_normal((60, 8)))
    labels = np.concatenate([np.repeat(np.arange(5), 11), [5, 6, 6, 6, 6]])
    sims = feats @ feats.T
    np.fill_diagonal(sims, -np.inf)
    same = labels[:, None] == labels[None, :]
    direct = np.where(same, sims, -np.inf).max(axis=1)
    nearest = intra_class_nearest(feats, labels, block_rows=4)
    assert np.isnan(nearest[55]) and np.allclose(np.delete(nearest, 55), np.delete(direct, 55), atol=1e-6)
    cfg = {"thresholds": "quantile", "lambda_max": 0.9, "lambda_min": 0.25, "merge_min_similarity": 0.5}
    at = similarity_thresholds(feats, labels, cfg)
    kept = np.delete(direct, 55)
    assert at == pytest.approx({"lambda_max": np.quantile(kept, 0.9), "lambda_min": np.quantile(kept, 0.25),
                                "merge_min_similarity": np.quantile(kept, 0.5)})
    assert similarity_thresholds(feats, labels, {**cfg, "thresholds": "absolute"}) == {
        "lambda_max": 0.9, "lambda_min": 0.25, "merge_min_similarity": 0.5}
    full = {**cfg, "meta_merge_similarity": 1.0, "tau_k_factor": 1.0, "tau_max_factor": 2.0, "cell_size_factor": 2.0,
            "neighbours": 8}
    stats = run_sgm(feats, labels, full, np.random.default_rng(0), top_down_labels=False).stats
    assert stats["threshold_lambda_min"] == pytest.approx(at["lambda_min"])
