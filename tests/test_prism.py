"""PRISM (Liu et al., CVPR 2021): memory and centres, P_clean, TRM/sTRM, the method in the trainer."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import batch_of
from noisydml.engine.judge import GroundTruth, score_decisions
from noisydml.methods import build_method, load_spec
from noisydml.methods.base import MethodSetup
from noisydml.methods.parts.prism import ClassCentreMemory, SlidingThreshold, clean_probability


def _centres_from_scratch(memory):
    valid = memory.labels >= 0
    feats, labels = memory.features[valid].double(), memory.labels[valid]
    sums = torch.zeros(memory.num_classes, feats.shape[1], dtype=torch.float64).index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=memory.num_classes)
    return (sums / counts.clamp(min=1).unsqueeze(1)), counts


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 64), classes=st.integers(1, 12), seed=st.integers(0, 2**31),
       batches=st.lists(st.integers(0, 80), min_size=1, max_size=40))
def test_incremental_centres_equal_recomputation(size, classes, seed, batches):
    gen = torch.Generator().manual_seed(seed)
    memory = ClassCentreMemory(size, 6, classes)
    for n in batches:
        memory.enqueue(torch.randn(n, 6, generator=gen), torch.randint(0, classes, (n,), generator=gen))
        centres, counts = _centres_from_scratch(memory)
        assert torch.equal(memory.class_counts, counts)
        assert torch.allclose(memory.centres().double(), centres, atol=1e-6)
        assert torch.all(memory.centres()[counts == 0] == 0)
    # FIFO: the memory holds exactly the last `size` enqueued items
    assert int((memory.labels >= 0).sum()) == min(size, sum(batches))


def test_fifo_replaces_the_oldest_items():
    memory = ClassCentreMemory(4, 2, 3)
    memory.enqueue(torch.tensor([[1.0, 0], [1, 0], [0, 1]]), torch.tensor([0, 0, 1]))
    memory.enqueue(torch.tensor([[0.0, 1], [0, 1]]), torch.tensor([2, 2]))  # overwrites the first item
    assert memory.labels.tolist() == [2, 0, 1, 2]
    assert memory.class_counts.tolist() == [1, 1, 2]


def test_p_clean_matches_eq7_and_eq3():
    gen = torch.Generator().manual_seed(0)
    memory = ClassCentreMemory(50, 8, 5)
    memory.enqueue(torch.randn(40, 8, generator=gen), torch.randint(0, 4, (40,), generator=gen))  # class 4 unseen
    emb = torch.randn(10, 8, generator=gen)
    labels = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    # Eq. 2-3 by hand: average cosine similarity to each class's stored features, softmax over classes
    f = F.normalize(emb, dim=1)
    v = F.normalize(memory.features[memory.labels >= 0], dim=1)
    lab = memory.labels[memory.labels >= 0]
    expected = []
    for i in range(10):
        t = torch.stack([(f[i] @ v[lab == k].T).mean() if (lab == k).any() else torch.tensor(0.0) for k in range(5)])
        expected.append(1.0 if labels[i] == 4 else float(torch.softmax(t, 0)[labels[i]]))
    for centres in (True, False):
        p = clean_probability(memory, emb, labels, centres=centres)
        assert torch.allclose(p, torch.tensor(expected), atol=1e-5), centres


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 128), rate=st.floats(0.0, 0.99), seed=st.integers(0, 2**31))
def test_trm_keeps_exactly_the_top_of_the_batch(n, rate, seed):
    scores = torch.rand(n, generator=torch.Generator().manual_seed(seed))  # distinct almost surely
    keep, _ = SlidingThreshold(rate, window=1).select(scores)
    k = math.floor(rate * n)
    assert int(keep.sum()) == n - k
    if 0 < k < n:
        assert scores[keep].min() > scores[~keep].max()


@settings(max_examples=20, deadline=None)
@given(rate=st.floats(0.05, 0.95), seed=st.integers(0, 2**31), batches=st.integers(1, 20))
def test_strm_with_window_one_is_trm_and_windows_average(rate, seed, batches):
    gen = torch.Generator().manual_seed(seed)
    trm, strm1, strm3 = SlidingThreshold(rate, 1), SlidingThreshold(rate, 1), SlidingThreshold(rate, 3)
    quantiles = []
    for _ in range(batches):
        scores = torch.rand(32, generator=gen)
        k = math.floor(rate * 32)
        quantiles.append(float(torch.sort(scores.double()).values[k - 1]))
        a, ta = trm.select(scores)
        b, tb = strm1.select(scores)
        assert torch.equal(a, b) and ta == tb
        _, t3 = strm3.select(scores)
        assert t3 == pytest.approx(np.mean(quantiles[-3:]))


def test_empty_selection_falls_back_to_dropping_the_lowest():
    thr = SlidingThreshold(0.5, window=2)
    thr.select(torch.tensor([0.9, 0.95, 0.99, 0.97]))  # Q = 0.95
    keep, threshold = thr.select(torch.tensor([0.1, 0.2, 0.3, 0.4]))  # all below the window mean
    assert threshold == pytest.approx((0.95 + 0.2) / 2)
    assert keep.tolist() == [False, False, True, True]


def test_fallback_resets_the_window_as_the_authors_code_does():
    """The authors' PRISM.py: on fallback, ``margin_window = margin_window[-1:]`` (the batch's own Q_t)."""
    keep_window, reset = SlidingThreshold(0.5, window=3), SlidingThreshold(0.5, window=3, reset_on_fallback=True)
    for thr in (keep_window, reset):
        thr.select(torch.tensor([0.9, 0.95, 0.99, 0.97]))  # Q = 0.95
        thr.select(torch.tensor([0.9, 0.92, 0.99, 0.97]))  # Q = 0.92
        keep, _ = thr.select(torch.tensor([0.1, 0.2, 0.3, 0.4]))  # Q = 0.2, all below the window mean
        assert thr.fell_back and keep.tolist() == [False, False, True, True]
    assert reset.values[: int(reset.count)].tolist() == pytest.approx([0.2])
    assert keep_window.values[: int(keep_window.count)].tolist() == pytest.approx([0.95, 0.92, 0.2])
    # the next batch is judged against Q_t's alone after a reset: (0.2 + 0.25) / 2
    _, threshold = reset.select(torch.tensor([0.22, 0.25, 0.3, 0.4]))  # Q = 0.25
    assert threshold == pytest.approx((0.2 + 0.25) / 2) and not reset.fell_back
    _, threshold = keep_window.select(torch.tensor([0.22, 0.25, 0.3, 0.4]))
    assert threshold == pytest.approx((0.92 + 0.2 + 0.25) / 3)


def _authors_memory_term(col, targets_col, row, target_row, margin=0.5, epsilon=1e-5):
    """The memory term of the PRISM authors' memory contrastive loss (memory_contrastive_loss_w_PRISM.py), written
    out: positives below 1 - eps and negatives above the margin, ``(sum(1 - s+) + sum(s-)) / n``."""
    sim = col @ row.T
    same = targets_col.view(-1, 1) == target_row.view(1, -1)
    pos, neg = same & (sim < 1 - epsilon), ~same & (sim > margin)
    return ((1 - sim[pos]).sum() + sim[neg].sum()) / len(col), int(neg.sum())


@pytest.mark.parametrize("name", ["mcl", "prism"])
def test_sum_over_batch_reduction_matches_the_authors_loss(name):
    """On a fixed memory, ``reduction: sum_over_batch`` gives the authors' gradient; the value differs by the
    constant margin x (negative pairs) / n, because pml's contrastive loss on a negative pair is s - margin and
    theirs is s (the same gradient)."""
    gen = torch.Generator().manual_seed(0)
    n, m, dim, classes = 16, 48, 16, 8
    memory = F.normalize(torch.randn(m, dim, generator=gen), dim=1)
    memory_labels = torch.randint(0, classes, (m,), generator=gen)
    raw = torch.randn(n, dim, generator=gen)
    labels = torch.randint(0, classes, (n,), generator=gen)
    overrides = {"memory_size": m + n, "reduction": "sum_over_batch"}
    if name == "prism":
        overrides["noise_rate"] = 0.0  # keep every sample: the base loss of PRISM on the whole batch
    method = build_method(name, _setup(name, **overrides))
    xbm = (method.base if name == "prism" else method).loss_fn
    xbm.embedding_memory[:m], xbm.label_memory[:m], xbm.queue_idx = memory, memory_labels, m
    ours_in = raw.clone().requires_grad_()
    ours, _ = method.loss(batch_of(F.normalize(ours_in, dim=1), labels, 0))
    ours.backward()
    # the authors' memory term over the same reference set: the memory after the batch is enqueued (pml's XBM
    # enqueues first; self-pairs are excluded on both sides)
    theirs_in = raw.clone().requires_grad_()
    f = F.normalize(theirs_in, dim=1)
    theirs, negatives = _authors_memory_term(f, labels, torch.cat([memory, f.detach()]),
                                             torch.cat([memory_labels, labels]))
    theirs.backward()
    assert negatives > 0
    assert float(ours.detach()) + 0.5 * negatives / n == pytest.approx(float(theirs.detach()), rel=1e-5)
    assert torch.allclose(ours_in.grad, theirs_in.grad, atol=1e-6)
    # pml's default reduction (pair means) is another loss on the same pairs: not the authors' gradient
    default = build_method(name, _setup(name, **{**overrides, "reduction": "pair_means"}))
    xbm = (default.base if name == "prism" else default).loss_fn
    xbm.embedding_memory[:m], xbm.label_memory[:m], xbm.queue_idx = memory, memory_labels, m
    other_in = raw.clone().requires_grad_()
    value, _ = default.loss(batch_of(F.normalize(other_in, dim=1), labels, 0))
    value.backward()
    cosine = F.cosine_similarity(other_in.grad.flatten(), theirs_in.grad.flatten(), dim=0)
    assert cosine < 0.99


def test_rate_zero_keeps_everything():
    keep, threshold = SlidingThreshold(0.0, 5).select(torch.rand(64))
    assert keep.all() and math.isnan(threshold)


def _setup(name, **overrides):
    hp = load_spec(name).check(overrides, f"methods.{name}")
    labels = np.repeat(np.arange(8), 8)
    return MethodSetup(hp, num_classes=8, embedding_dim=16, dataset_size=64, train_labels=labels, seed=0)


def test_prism_with_rate_zero_is_mcl():
    torch.manual_seed(0)
    prism = build_method("prism", _setup("prism", noise_rate=0.0, memory_size=128))
    mcl = build_method("mcl", _setup("mcl", memory_size=128))
    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        emb = F.normalize(torch.randn(16, 16, generator=gen), dim=1)
        labels = torch.randint(0, 8, (16,), generator=gen)
        ids = torch.arange(16)
        a, _ = prism.loss(batch_of(emb, labels, step, ids))
        b, _ = mcl.loss(batch_of(emb, labels, step, ids))
        assert torch.allclose(a, b)


def test_prism_selects_clean_samples_and_reports_precision_recall():
    """Two well-separated clusters per label; noisy samples sit in another label's cluster."""
    method = build_method("prism", _setup("prism", noise_rate=0.25, window=1, memory_size=256))
    gen = torch.Generator().manual_seed(0)
    centres = F.normalize(torch.randn(8, 16, generator=gen), dim=1)
    true = torch.arange(64) % 8
    noisy_mask = (torch.arange(64) // 8) % 4 == 0  # 2 of the 8 samples of every class
    labels = torch.where(noisy_mask, (true + 3) % 8, true)
    method.on_epoch_start(None)
    for step in range(20):
        emb = F.normalize(centres[true] * 5 + 0.3 * torch.randn(64, 16, generator=gen), dim=1)
        method.loss(batch_of(emb.requires_grad_(), labels, step))
    # the method decides; the trainer's judge scores the decisions against ground truth PRISM never sees
    scores = score_decisions(method.decisions(), GroundTruth(noisy_mask.numpy(), true.numpy(), np.ones(64, bool)))
    assert scores["diag_kept_fraction"] == pytest.approx(0.75 * 19 / 20 + 1 / 20, abs=0.02)
    assert scores["diag_selection_precision"] > 0.95
    assert 0.85 < scores["diag_selection_recall"] <= 1.0


def test_softtriple_prism_builds_and_trains_proxies():
    method = build_method("softtriple_prism", _setup("softtriple_prism", memory_size=64))
    assert method.lr_multiplier() == 100.0
    emb = F.normalize(torch.randn(16, 16), dim=1).requires_grad_()
    loss, _ = method.loss(batch_of(emb, torch.arange(16) % 8, 0))
    loss.backward()
    assert any(p.grad is not None for p in method.parameters())


def _kept_fraction(method):
    d = method.decisions()
    return float(np.nansum(d.keep * d.visits) / d.visits.sum())  # per visit


def test_warmup_keeps_every_sample():
    method = build_method("prism", _setup("prism", noise_rate=0.5, warmup_steps=3, memory_size=64))
    emb = F.normalize(torch.randn(16, 16), dim=1)
    for step in range(3):
        method.on_epoch_start(None)
        method.loss(batch_of(emb, torch.arange(16) % 8, step))
        assert _kept_fraction(method) == 1.0
    method.on_epoch_start(None)
    method.loss(batch_of(emb, torch.arange(16) % 8, 3))
    assert _kept_fraction(method) <= 0.5


def _bench():
    from conftest import load_script

    return load_script("bench_prism_scale")


def test_selection_at_sop_scale_keeps_clean_scorable_samples():
    """11,318 classes, memory 8,192, 200 batches of 16 x 4 class-structured embeddings, 50% noise.

    Ranking every sample with P_clean = 1 for classes absent from the memory (the authors' rule, as their code
    runs it) makes the quantile 1.0, which never enters their window: it stays empty for most batches, each of
    which then drops its floor(R*B) lowest, the scorable samples first; almost none is kept, and the fallback is
    never taken. Ranking the scorable ones only keeps about half of them, with a precision well above their
    clean share."""
    bench = _bench()
    ours = bench.simulate(11318, batches=200, rule="ours")
    authors = bench.simulate(11318, batches=200, rule="authors")
    assert authors["kept_share_of_scorable"] < 0.05 and authors["empty_window_rate"] > 0.7
    assert authors["fallback_rate"] == 0.0 and 0.45 < authors["kept_share"] < 0.6
    assert 0.3 < ours["kept_share_of_scorable"] < 0.8 and ours["fallback_rate"] < 0.05
    assert ours["precision"] > ours["clean_share_of_scorable"] + 0.15


def test_unscorable_samples_are_kept_or_dropped_and_never_ranked():
    p = torch.tensor([1.0, 1.0, 0.9, 0.1, 0.8, 0.2])
    scorable = torch.tensor([False, False, True, True, True, True])
    keep, _ = SlidingThreshold(0.5, 1).select(p, scorable)  # k = floor(0.5 * 4) = 2: Q = 0.2
    assert keep.tolist() == [True, True, True, False, True, False]
    keep, _ = SlidingThreshold(0.5, 1, keep_unscorable=False).select(p, scorable)
    assert keep.tolist() == [False, False, True, False, True, False]
    keep, threshold = SlidingThreshold(0.5, 1).select(p, torch.zeros(6, dtype=torch.bool))
    assert keep.all() and math.isnan(threshold)  # nothing scorable: nothing ranked, nothing dropped
