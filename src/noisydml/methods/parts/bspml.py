"""BSPML: balanced self-paced metric learning (Zhang, Luo, Gu, AAAI 2023), shared by ``bspml`` and ``spms``.

Equation numbers are the paper's; "spec §n" is ``shared/papers/bspml-spec.md``. No public code exists.

Alg. 1 alternates a model step and a weight step, with the age ``lambda`` growing between rounds:

- **model step** (Alg. 2): P x K batches, multi-similarity pair mining (Eqs. 4-5, pml's
  ``MultiSimilarityMiner``) and the weighted informative batch loss of Eq. 7 (:func:`weighted_ms_loss`),
  read with *product* denominators (spec §1: the power reading would scale the negative term by |N|^-49);
- **weight step** (Alg. 3): the doubly stochastic projected coordinate gradient on Eq. 6
  (:func:`weight_step`), with Eq. 8's stochastic gradient (:func:`sampled_gradient`) and the ``1/N^k``
  *inside* the sum over classes (spec §1, §5: only that reading makes Eq. 8 unbiased). Its ``xi+`` and ``xi-``
  are Eq. 3's full-class, un-mined quantities over the whole training set (:func:`xi_positive`,
  :func:`xi_negative`), computed class by class and in row blocks: never an N x N matrix.

Choices that are ours (the paper gives none; spec §9, §14), all parameters of ``methods.bspml``:

- ``step_size``: Alg. 3's ``gamma`` scaled by the class size, ``gamma_c = step_size * N^c``, so that a
  coordinate moves by ``step_size * (G_p + G_n + G_b - lambda)`` whatever its class's size (Eq. 8's ``1/N^c``
  would otherwise freeze the weights of large classes, spec §6);
- ``passes`` x N coordinate updates per weight step, each pass visiting the coordinates in a random order;
- partners, classes and samples of Eq. 8 drawn uniformly **with** replacement (unbiased either way, spec §5);
- ``block``: coordinates updated together from the weights and class sums at the block's start (a
  block-Jacobi version of Alg. 3's sequential loop, so that it is not a Python loop over coordinates);
  ``block: 1`` is the paper's sequential algorithm;
- ``xi.negatives: topk``: an approximation of ``xi-`` at SOP size from each sample's ``topk`` nearest
  neighbours (faiss); with ``beta = 50`` and ``rho = 1`` a negative at similarity 0.8 adds e^-10 to the sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from pytorch_metric_learning import miners
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from noisydml.methods.base import Batch, Decisions, EpochContext, Method, MethodSetup, MethodSpec
from noisydml.schema import Field, ParamsError


# ---------------------------------------------------------------------------------------------- model step


def weighted_ms_loss(embeddings: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, miner,
                     alpha: float, beta: float, base: float) -> torch.Tensor:
    """Eq. 7, the weighted informative batch loss (product denominators, spec §4, §14 l)::

        1/PK sum_i w_i [ (sum_{p in P_i} w_p)/(|P_i| alpha) log(1 + sum_{p in P_i} exp(-alpha (S_ip - rho)))
                       + (sum_{n in N_i} w_n)/(|N_i| beta)  log(1 + sum_{n in N_i} exp( beta (S_in - rho))) ]

    ``P_i``/``N_i``: the informative pairs of anchor i (Eqs. 4-5) from ``miner`` (pml's
    ``MultiSimilarityMiner``); ``weights`` are constants of the model step (detached); an anchor with no mined
    positive (negative) has a positive (negative) term of 0, and the mean runs over all PK anchors. With all
    weights 1 this is pml's ``MultiSimilarityLoss(alpha, beta, base)`` with the same miner (a test).
    """
    weights = weights.detach().to(embeddings.dtype)
    a1, p, a2, n = lmu.convert_to_pairs(miner(embeddings, labels), labels)
    size = len(embeddings)
    pos_mask = torch.zeros(size, size, dtype=torch.bool, device=embeddings.device)
    neg_mask = torch.zeros_like(pos_mask)
    pos_mask[a1, p] = True
    neg_mask[a2, n] = True
    sim = embeddings @ embeddings.T  # cosine: the embeddings are L2-normalised
    pos_log = lmu.logsumexp(-alpha * (sim - base), keep_mask=pos_mask, add_one=True).squeeze(1)
    neg_log = lmu.logsumexp(beta * (sim - base), keep_mask=neg_mask, add_one=True).squeeze(1)
    pos_weight = (pos_mask * weights[None, :]).sum(1) / pos_mask.sum(1).clamp(min=1)
    neg_weight = (neg_mask * weights[None, :]).sum(1) / neg_mask.sum(1).clamp(min=1)
    per_anchor = weights * (pos_weight / alpha * pos_log + neg_weight / beta * neg_log)
    return per_anchor.mean()


# ---------------------------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class ClassIndex:
    """The training rows grouped by (noisy) class, for drawing class-mates and other classes fast."""

    labels: np.ndarray    # (N,) class of every row
    order: np.ndarray     # rows sorted by class (stable)
    start: np.ndarray     # (C,) first position of each class in ``order``
    count: np.ndarray     # (C,) rows per class (0 for a label id no row has)
    position: np.ndarray  # (N,) each row's position within its class's block of ``order``
    present: np.ndarray   # label ids that have rows: the classes of Eqs. 6 and 8

    @classmethod
    def of(cls, labels: np.ndarray) -> "ClassIndex":
        labels = np.asarray(labels, dtype=np.int64)
        num_classes = int(labels.max()) + 1 if len(labels) else 0
        order = np.argsort(labels, kind="stable")
        count = np.bincount(labels, minlength=num_classes)
        start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        position = np.empty(len(labels), dtype=np.int64)
        position[order] = np.arange(len(labels)) - start[labels[order]]
        return cls(labels, order, start, count, position, np.flatnonzero(count))

    def rows_of(self, c: int) -> np.ndarray:
        return self.order[self.start[c] : self.start[c] + self.count[c]]


# ---------------------------------------------------------------------------------------------- Eq. 3


def xi_positive(embeddings: np.ndarray, index: ClassIndex, alpha: float, base: float) -> np.ndarray:
    """Eq. 3's ``xi+(x_a) = 1/alpha log(1 + sum_{p in class(a), p != a} exp(-alpha (S_ap - rho)))`` for every
    row: the full class, un-mined (spec §6), one class at a time (float64)."""
    emb = torch.as_tensor(np.ascontiguousarray(embeddings, dtype=np.float32))
    out = np.zeros(len(emb), dtype=np.float64)
    for c in index.present:
        rows = index.rows_of(c)
        if len(rows) < 2:
            continue  # no class-mate: log(1 + 0) = 0
        e = emb[torch.as_tensor(rows)].double()
        x = -alpha * (e @ e.T - base)
        x.fill_diagonal_(float("-inf"))
        out[rows] = (torch.logaddexp(torch.logsumexp(x, dim=1), torch.zeros(())) / alpha).numpy()
    return out


def xi_negative(embeddings: np.ndarray, labels: np.ndarray, beta: float, base: float,
                similarity_blocks: Callable[..., Iterator[tuple[int, np.ndarray]]], rows: np.ndarray | None = None,
                block_rows: int = 2048) -> np.ndarray:
    """Eq. 3's ``xi-(x_a) = 1/beta log(1 + sum_{n: class(n) != class(a)} exp(beta (S_an - rho)))``, exact: every
    negative of the training set, a block of rows at a time (``rows``: only these anchors). float64 out."""
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    labels = np.asarray(labels)
    anchors = np.arange(len(emb)) if rows is None else np.asarray(rows)
    lab = torch.as_tensor(labels)
    out = np.zeros(len(anchors), dtype=np.float64)
    for start, sim in similarity_blocks(emb[anchors], emb, block_rows):
        x = beta * (torch.from_numpy(sim) - base)
        same = lab[torch.as_tensor(anchors[start : start + len(sim)])][:, None] == lab[None, :]
        x.masked_fill_(same, float("-inf"))
        out[start : start + len(sim)] = (torch.logaddexp(torch.logsumexp(x, dim=1), torch.zeros(())) / beta).numpy()
    return out


def xi_negative_topk(embeddings: np.ndarray, labels: np.ndarray, beta: float, base: float, k: int,
                     knn: Callable[..., tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``xi-`` from each row's ``k`` most similar rows only (ours, for SOP-sized sets): the negatives among them
    enter Eq. 3's sum, the rest are dropped. Every dropped term is at most ``exp(beta (S_k - rho))`` with
    ``S_k`` the k-th similarity, so the estimate is a lower bound of the exact value; ``scripts/bench_bspml.py``
    prints its error."""
    labels = np.asarray(labels)
    sims, idx = knn(embeddings, k)
    x = torch.from_numpy(beta * (sims.astype(np.float32) - base))
    same = torch.from_numpy(labels[idx] == labels[:, None])
    x.masked_fill_(same | torch.from_numpy(idx < 0), float("-inf"))
    return (torch.logaddexp(torch.logsumexp(x, dim=1), torch.zeros(())) / beta).double().numpy()


# ---------------------------------------------------------------------------------------------- weight step


def class_means(weights: np.ndarray, index: ClassIndex) -> np.ndarray:
    """``zeta(c) / N^c`` of every present class (Eq. 6), in ``index.present`` order."""
    zeta = np.bincount(index.labels, weights=weights, minlength=len(index.count))
    return zeta[index.present] / index.count[index.present]


def maw_sdaw(weights: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Eq. 14: MAW, the mean over classes of the class's mean weight, and SDAW, their population SD."""
    means = class_means(np.asarray(weights, dtype=np.float64), ClassIndex.of(labels))
    return float(means.mean()), float(means.std())


def sampled_gradient(coords: np.ndarray, weights: np.ndarray, zeta: np.ndarray, xi_pos: np.ndarray,
                     xi_neg: np.ndarray, index: ClassIndex, lam: float, mu: float, classes: int, per_class: int,
                     rng: np.random.Generator) -> np.ndarray:
    """``N^c * G(w_a^c)`` of Eq. 8 for each coordinate ``a`` in ``coords`` (the ``1/N^c`` factor is left to the
    step size, see the module docstring)::

        G_p = 1/K sum_{p} w_p (xi+(x_p) + xi+(x_a))                  K class-mates p != a
        G_n = 1/P sum_{k} 1/K sum_{n} w_n (xi-(x_n) + xi-(x_a))       P other classes k, K rows n of each
        G_b = 2 mu (zeta(c)/N^c - 1/(C-1) sum_{k != c} zeta(k)/N^k)
        N^c G = G_p + G_n + G_b - lambda

    ``zeta``: the class sums of ``weights`` (by label id). Draws are uniform with replacement, so the
    expectation is Eq. 6's exact partial derivative (a test); a singleton class has no ``G_p`` and a
    single-class problem no ``G_n``/``G_b``.
    """
    c = index.labels[coords]
    n_c = index.count[c]
    # G_p: K class-mates other than a: a uniform position among the N^c - 1 others, skipping a's own
    r = np.floor(rng.random((len(coords), per_class)) * np.maximum(n_c - 1, 1)[:, None]).astype(np.int64)
    r += r >= index.position[coords][:, None]
    mates = index.order[np.minimum(index.start[c][:, None] + r, len(index.order) - 1)]
    g_p = (weights[mates] * (xi_pos[mates] + xi_pos[coords][:, None])).mean(axis=1)
    g_p[n_c < 2] = 0.0
    num_present = len(index.present)
    if num_present < 2:
        return g_p - lam
    # G_n: P classes other than c (uniform over the C - 1 others), then K rows of each
    slot = np.searchsorted(index.present, c)
    t = np.floor(rng.random((len(coords), classes)) * (num_present - 1)).astype(np.int64)
    t += t >= slot[:, None]
    k = index.present[t]
    u = np.floor(rng.random((len(coords), classes, per_class)) * index.count[k][..., None]).astype(np.int64)
    others = index.order[index.start[k][..., None] + u]
    g_n = (weights[others] * (xi_neg[others] + xi_neg[coords][:, None, None])).mean(axis=(1, 2))
    # G_b from the class means
    means = zeta / np.maximum(index.count, 1)
    total = means[index.present].sum()
    g_b = 2.0 * mu * (means[c] - (total - means[c]) / (num_present - 1))
    return g_p + g_n + g_b - lam


def exact_gradient(coords: np.ndarray, weights: np.ndarray, sums: tuple[np.ndarray, np.ndarray, np.ndarray],
                   xi_pos: np.ndarray, xi_neg: np.ndarray, index: ClassIndex, lam: float, mu: float) -> np.ndarray:
    """``N^c * dEq.6/dw_a`` for each coordinate ``a`` in ``coords``, exactly: the expectation of
    :func:`sampled_gradient` (ours: with xi fixed, every sum of Eq. 8 is a class sum, so the exact value costs
    O(1) per coordinate)::

        G_p = 1/(N^c - 1) [ sum_{p in c} w_p xi+_p - w_a xi+_a + xi+_a (zeta(c) - w_a) ]
        G_n = 1/(C - 1) sum_{k != c} 1/N^k [ sum_{n in k} w_n xi-_n + xi-_a zeta(k) ]

    and ``G_b``, ``lambda`` as there. ``sums``: per label id, ``zeta`` (sum of w), sum of ``w xi+`` and of
    ``w xi-``, kept current by the caller.
    """
    zeta, pos_sum, neg_sum = sums
    c = index.labels[coords]
    n_c = index.count[c]
    w = weights[coords]
    g_p = (pos_sum[c] - w * xi_pos[coords] + xi_pos[coords] * (zeta[c] - w)) / np.maximum(n_c - 1, 1)
    g_p[n_c < 2] = 0.0
    num_present = len(index.present)
    if num_present < 2:
        return g_p - lam
    count = np.maximum(index.count, 1)
    neg_mean, means = neg_sum / count, zeta / count
    neg_total, total = neg_mean[index.present].sum(), means[index.present].sum()
    g_n = ((neg_total - neg_mean[c]) + xi_neg[coords] * (total - means[c])) / (num_present - 1)
    g_b = 2.0 * mu * (means[c] - (total - means[c]) / (num_present - 1))
    return g_p + g_n + g_b - lam


GRADIENTS = ("sampled", "exact")


def weight_step(weights: np.ndarray, xi_pos: np.ndarray, xi_neg: np.ndarray, index: ClassIndex, lam: float,
                mu: float, step_size: float, passes: int, classes: int, per_class: int, block: int,
                rng: np.random.Generator, tolerance: float = 0.0, trace: list[float] | None = None,
                gradient: str = "sampled") -> np.ndarray:
    """Alg. 3 on Eq. 6 with ``xi`` fixed: up to ``passes`` x N projected coordinate steps
    ``w_a <- clip(w_a - gamma_c G(w_a), 0, 1)`` with ``gamma_c = step_size * N^c``; returns the new weights
    (``trace``, when given, receives each pass's mean absolute weight change).

    Each pass visits the coordinates in a random order, ``block`` at a time: a block's gradients use the weights
    and class sums at its start (``block: 1`` is the paper's sequential loop), and the class sums ``zeta`` are
    kept up to date after every block so that ``G_b`` costs O(1) per coordinate. The step stops after the first
    pass whose mean absolute weight change is at most ``tolerance`` (ours; Theorem 1's convergence, read as a
    stopping rule; 0 = always ``passes``). Eq. 8's gradient is sampled, so with a constant step the change never
    reaches 0: the tolerance must sit above that floor (``scripts/bspml_convergence.py`` measures it).
    ``gradient: exact`` (ours) uses :func:`exact_gradient` instead, Eq. 8's expectation: projected coordinate
    descent that settles, so that the tolerance can be met.
    """
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient {gradient!r}; allowed: {', '.join(GRADIENTS)}")
    w = np.array(weights, dtype=np.float64, copy=True)
    size = len(index.count)
    zeta = np.bincount(index.labels, weights=w, minlength=size)
    pos_sum = np.bincount(index.labels, weights=w * xi_pos, minlength=size)
    neg_sum = np.bincount(index.labels, weights=w * xi_neg, minlength=size)
    for _ in range(passes):
        before = w.copy()
        perm = rng.permutation(len(w))
        for s in range(0, len(w), block):
            coords = perm[s : s + block]
            if gradient == "exact":
                grad = exact_gradient(coords, w, (zeta, pos_sum, neg_sum), xi_pos, xi_neg, index, lam, mu)
            else:
                grad = sampled_gradient(coords, w, zeta, xi_pos, xi_neg, index, lam, mu, classes, per_class, rng)
            new = np.clip(w[coords] - step_size * grad, 0.0, 1.0)
            delta = new - w[coords]
            at = index.labels[coords]
            np.add.at(zeta, at, delta)
            np.add.at(pos_sum, at, delta * xi_pos[coords])
            np.add.at(neg_sum, at, delta * xi_neg[coords])
            w[coords] = new
        change = float(np.abs(w - before).mean()) if len(w) else 0.0
        if trace is not None:
            trace.append(change)
        if tolerance > 0 and change <= tolerance:  # 0: every pass, as Alg. 3 with a fixed T
            break
    return w


# ---------------------------------------------------------------------------------------------- the method


AGE_UNITS = ("absolute", "log_class_size")


def age_unit(unit: str, labels: np.ndarray, alpha: float) -> float:
    """What ``lambda_0``, ``lambda_inf`` and a numeric ``mu`` are multiplied by (ours): 1 (``absolute``, the
    paper's plain ages) or ``(2/alpha) log(N / C)`` (``log_class_size``; N / C the mean class size by noisy label).

    Why: at rho = 1 every positive term of Eq. 3 is at least 1, so ``xi+ >= (1/alpha) log N^c`` (spec §6), and
    Eq. 8's ``G_p ~ 2 w xi+`` grows with the log of the class size: an age tuned on 32-image classes keeps
    nearly every weight at 1 on 20-image classes. In this unit one value transfers across datasets.
    """
    if unit == "absolute":
        return 1.0
    labels = np.asarray(labels)
    mean_class = len(labels) / max(len(np.unique(labels)), 1)
    return float(2.0 / alpha * np.log(max(mean_class, 2.0)))




def _check(hparams: dict, where: str) -> None:
    if hparams["lambda_0"] > hparams["lambda_inf"]:
        raise ParamsError(f"{where}.lambda_0: {hparams['lambda_0']!r} is above lambda_inf "
                          f"({hparams['lambda_inf']!r}); allowed: 0 < lambda_0 <= lambda_inf (Alg. 1)")
    mu = hparams.get("mu")
    if isinstance(mu, str) and mu != "lambda_inf":
        raise ParamsError(f"{where}.mu: {mu!r} is not allowed; allowed: a number >= 0, or lambda_inf "
                          "(the paper's mu = lambda_inf)")
    if not isinstance(mu, str) and mu is not None and mu < 0:
        raise ParamsError(f"{where}.mu: {mu!r} is below the minimum 0")


class BSPMLMethod(Method):
    """Alg. 1: model steps on Eq. 7 with the sample weights fixed; after every ``epochs_per_round`` epochs a
    weight step (Alg. 3) from the current model's embeddings of the training set (eval mode), then
    ``lambda <- min(age_multiplier * lambda, lambda_inf)``. The first round trains with all weights 1 and its
    weight step uses ``lambda_0`` (spec §7). Weights, age and round counter are buffers: checkpointed, so a
    resumed run continues bit-exactly (each weight step's draws are seeded by (seed, round))."""

    def __init__(self, setup: MethodSetup, balance: bool):
        super().__init__(setup)
        h = setup.hparams
        self.miner = miners.MultiSimilarityMiner(epsilon=h["miner"]["epsilon"])
        # the ages in the unit of methods.<bspml>.age_unit, from the noisy labels of the rows trained on
        self.unit = age_unit(h["age_unit"], setup.train_labels, h["loss"]["alpha"])
        self.lambda_inf = h["lambda_inf"] * self.unit
        self.mu = 0.0 if not balance else (self.lambda_inf if h["mu"] == "lambda_inf" else float(h["mu"]) * self.unit)
        self.index = ClassIndex.of(setup.train_labels)
        self.register_buffer("weights", torch.ones(setup.dataset_size, dtype=torch.float64))
        self.register_buffer("age", torch.tensor(float(h["lambda_0"]) * self.unit, dtype=torch.float64))
        self.register_buffer("rounds", torch.tensor(0, dtype=torch.int64))

    def loss(self, batch: Batch):
        loss_cfg = self.hparams["loss"]
        w = self.weights[batch.index].to(batch.embeddings.dtype)
        loss = weighted_ms_loss(batch.embeddings, batch.labels, w, self.miner,
                                loss_cfg["alpha"], loss_cfg["beta"], loss_cfg["base"])
        return loss, {"batch_mean_weight": float(w.mean())}

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        h = self.hparams
        if (ctx.epoch + 1) % h["epochs_per_round"]:
            return {}
        emb = np.asarray(ctx.embed_train(), dtype=np.float32)
        loss_cfg, xi_cfg, step_cfg = h["loss"], h["xi"], h["weight_step"]
        xi_pos = xi_positive(emb, self.index, loss_cfg["alpha"], loss_cfg["base"])
        if xi_cfg["negatives"] == "exact":
            xi_neg = xi_negative(emb, self.index.labels, loss_cfg["beta"], loss_cfg["base"], ctx.similarity_blocks)
        else:
            xi_neg = xi_negative_topk(emb, self.index.labels, loss_cfg["beta"], loss_cfg["base"], xi_cfg["topk"],
                                      ctx.knn)
        lam, rounds = float(self.age), int(self.rounds)
        rng = np.random.default_rng([self.setup.seed, rounds, 0xB5])
        trace: list[float] = []
        w = weight_step(self.weights.cpu().numpy(), xi_pos, xi_neg, self.index, lam, self.mu,
                        step_cfg["step_size"], step_cfg["passes"], step_cfg["classes"], step_cfg["per_class"],
                        step_cfg["block"], rng, tolerance=step_cfg["tolerance"], trace=trace,
                        gradient=step_cfg["gradient"])
        self.weights.copy_(torch.from_numpy(w))
        self.rounds.fill_(rounds + 1)
        self.age.fill_(min(h["age_multiplier"] * lam, self.lambda_inf))
        maw, sdaw = maw_sdaw(w, self.index.labels)
        return {"bspml_lambda": lam, "bspml_maw": maw, "bspml_sdaw": sdaw, "bspml_weight_passes": len(trace),
                "bspml_weight_change": trace[-1],
                "bspml_zero_weight_fraction": float((w == 0).mean()), "bspml_xi_pos_mean": float(xi_pos.mean()),
                "bspml_xi_neg_mean": float(xi_neg.mean())}

    def decisions(self) -> Decisions:
        return Decisions(weights=self.weights.cpu().numpy().copy())

    def export(self, ctx: EpochContext) -> dict[str, np.ndarray]:
        return {"weights": self.weights.cpu().numpy().copy()}


def bspml_spec(balance: bool) -> MethodSpec:
    """``bspml`` (``balance``: Eq. 6 with its balance term, weight ``mu``) or ``spms`` (mu = 0: the paper's
    ablation "SPL in MS without the balance regularization term")."""
    schema: dict[str, Field] = {
        "loss": Field(dict, {"alpha": 2.0, "beta": 50.0, "base": 1.0}),
        "miner": Field(dict, {"epsilon": 0.1}),
        "lambda_inf": Field(float, 3.1, min=0.0, help="maximum age, in age_unit; the paper tunes it in [1, 5] "
                                                     "(absolute)"),
        "lambda_0": Field(float, 2.56, min=0.0, help="ours: initial age, in age_unit (Alg. 1; not given by the paper)"),
        "age_unit": Field(str, "absolute", choices=AGE_UNITS,
                          help="ours: absolute = the paper's ages; log_class_size = multiples of (2/alpha) log(mean "
                               "class size), the scale of Eq. 8's G_p, so that one value transfers across datasets"),
        "age_multiplier": Field(float, 1.1, min=1.0, help="ours: Alg. 1's c (not given by the paper)"),
        "epochs_per_round": Field(int, 1, min=1, help="ours: epochs of model steps per weight step"),
        "weight_step": Field(dict, {"step_size": 0.1, "passes": 10, "tolerance": 0.0, "gradient": "sampled",
                                    "classes": 16, "per_class": 16, "block": 256}),
        "xi": Field(dict, {"negatives": "exact", "topk": 512}),
        "lr_multiplier": Field(float, 1.0, min=0.0),
    }
    if balance:
        schema["mu"] = Field((float, int, str), "lambda_inf", help="balance weight; the paper: mu = lambda_inf")
    nested = {
        "loss": {"alpha": Field(float, 2.0, min=0.0), "beta": Field(float, 50.0, min=0.0),
                 "base": Field(float, 1.0, help="rho of Eq. 3; the paper: 1")},
        "miner": {"epsilon": Field(float, 0.1, min=0.0)},
        "weight_step": {
            "step_size": Field(float, 0.1, min=0.0, help="ours: gamma_c = step_size * N^c"),
            "passes": Field(int, 10, min=1, help="ours: Alg. 3's T = at most passes x N coordinate updates"),
            "tolerance": Field(float, 0.0, min=0.0,
                               help="ours: a weight step stops after the first pass whose mean absolute weight change "
                                    "is at most this (0 = always all passes); scripts/bspml_convergence.py measures "
                                    "the sampled gradient's floor"),
            "gradient": Field(str, "sampled", choices=GRADIENTS,
                              help="sampled = Eq. 8's doubly stochastic estimate (Alg. 3); exact = its expectation "
                                   "from class sums (ours: with xi fixed it costs O(1) per coordinate, and the step "
                                   "settles, so the tolerance can be met)"),
            "classes": Field(int, 16, min=1, help="ours: Alg. 3's P (other classes drawn per update)"),
            "per_class": Field(int, 16, min=1, help="ours: Alg. 3's K (rows drawn per class)"),
            "block": Field(int, 256, min=1, help="ours: coordinates updated together (1 = sequential Alg. 3)"),
        },
        "xi": {"negatives": Field(str, "exact", choices=("exact", "topk")),
               "topk": Field(int, 512, min=1, help="ours: neighbours searched for xi- when negatives: topk")},
    }
    description = ("BSPML: balanced self-paced multi-similarity (Zhang et al. 2023)" if balance else
                   "SPMS: BSPML without the balance term (mu = 0), the paper's ablation")
    return MethodSpec(build=lambda setup: BSPMLMethod(setup, balance), schema=schema, exports=("weights",),
                      description=description,
                      nested=nested, validate=_check)
