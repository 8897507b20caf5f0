"""SGPS: subgroup-based positive-pair selection (Yu, Xu, Jiang, Sun, Huang; IEEE TIP 2024, arXiv 2312.09147).

PRISM's clean-sample selection (PCS, Sec. III-C: Eqs. 1-2, :mod:`~noisydml.methods.parts.prism`)
splits each batch; the kept samples train the clean loss (Eq. 12: MCL for ``sgps``, SupCon for
``sgps_supcon``) and enter the memory, exactly as in PRISM, so with ``gamma_batch = gamma_bank = 0`` SGPS *is*
PRISM. What PRISM throws away, SGPS uses:

- **Feature bank** (Eq. 3): ``F(x_i) <- normalize(alpha f(x_i) + (1 - alpha) F(x_i))`` whenever row i is in a
  batch (alpha weights the *new* feature, A8), initialised with one embedding pass of the training set when the
  run starts (in the posterior chain's stage 3: the stage-2 model's features, as Sec. IV-E says).
- **SGM** (Sec. III-D, Algs. 1-4, :mod:`~noisydml.methods.parts.sgm`) on the bank: ``c^B`` and ``c^T`` for every
  row, synchronously at the start of every ``sgm.every_epochs``-th epoch from ``sgm.start_epoch`` (ours, A25: the
  paper's asynchronous server would break bit-exact resume), seeded by (seed, round).
- **Positives** (Sec. III-E): for every rejected sample, K (= 4, Sec. IV-E) rows drawn from its ``c^B``- and/or
  ``c^T``-mates (``positives``: both = the union, A3; bottom_up / top_down for Fig. 5a), self excluded, without
  replacement (with replacement when fewer than K), seeded by (seed, step). Their embeddings (``positive_source``,
  A2): ``bank`` (ours) the feature bank's, detached -- no extra forward pass, so Table VI's overhead is the SGM and
  PPM work only; ``forward`` (the authors' code, and Sec. IV-E's runtime text, "extra K positive samples selected
  by SGM") K positives drawn for *every* batch item before PCS decides (it cannot know the rejected ones before the
  forward), their images loaded and forwarded with the batch in one training-mode pass
  (:meth:`~noisydml.methods.base.Method.extra_samples`), with gradient; the rejected items' positives feed the
  prototypes. Only the batch's own rows update the bank and the memory (ours, both sources). The authors' code
  differs for the bank: its training step sends every forwarded image's feature to the feature server, the
  positives' too (``sgps/systems/sgps.py``, ``update_feature`` over all the step's indices), so with ``forward`` a
  positive's bank row is refreshed when it is drawn; here it is refreshed when it is next in a batch (once an
  epoch), with alpha 0.9 on the new feature either way.
- **PPM** (Eqs. 7-9, TransProto): Mean, Max (the positive most similar to the anchor), SoftMax (weights
  ``softmax(mean_k (F F^T - I))``, Eq. 9, no temperature), or TransProto: ``layers`` pre-LN transformer decoder
  blocks over the K positive tokens (self-attention, cross-attention to ``conditioning`` bank features of the
  anchor's subgroup-mates, FFN ``ffn_factor x d``), outputs summed and normalised (Sec. III-E). Ours (A5): 4 heads,
  no positional encoding, dropout 0, and the residual branches' output layers start at zero, so TransProto starts
  as the normalised Mean and learns from there. Every prototype is L2-normalised (A4).
- **The authors' training loop** (``authors``, each off by default; ``sgps/loss/noisefree.py`` and
  ``sgps/systems/sgps.py`` of their code, not the paper; with ``positive_source: forward`` only):
  ``selection_on_all``: PCS runs a second time per step on all forwarded images (the queries and their K
  positives each, with their own noisy labels), pushing a second ``Q_t`` into the same sTRM window and leaving the
  memory and centres alone; L_noise's anchors are the queries this second call rejects (their ``keep_bool``).
  ``clean_loss_on_all``: L_clean a second time, weight 1, on every image the second call keeps (queries and
  positives) against the memory of earlier steps, nothing enqueued (their ``loss_pr_all``; needs
  ``selection_on_all``). ``positives_update_bank``: the forwarded positives' features also update their bank
  rows by Eq. 3 (their ``update_feature`` over all the step's indices), once per row per step.
- **L_noise** (Eqs. 13-16): ``-log e^{(z.r - delta)/tau} / (e^{(z.r - delta)/tau} + sum_{j in N_i} e^{z.z_j/tau})``,
  negatives the batch rows (Eq. 14) and memory entries (Eq. 15) whose noisy label, ``c^B`` and ``c^T`` all differ
  from the anchor's (in the one-label ablations only the labels in use count, A19; memory entries' subgroups are
  looked up by row at loss time, A20); each term is the mean over anchors with a positive (A21), and
  ``L_noise = gamma_batch x batch term + gamma_bank x memory term`` (Eq. 16). Total: Eq. 17.

Exposed for judging (never shown ground truth): PCS's keep decisions, the subgroup labellings whose union
gives the positive candidates, and the positives drawn this epoch. Exported: PCS's last-epoch keep and, from a
fresh Alg. 1 + 2 pass on the final model's training embeddings, ``bottom_up_label`` (``c^B``) and
``bottom_up_keep`` (its group has at least 2 rows): the posterior data clean's stage-1 pseudo-labels (Sec. IV-E).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from noisydml.methods.base import Batch, Decisions, EpochContext, ExtraRows, MethodSetup, MethodSpec
from noisydml.methods.parts.prism import PrismMethod, selector_schema
from noisydml.methods.parts.sgm import run_sgm
from noisydml.schema import Field, ParamsError

if TYPE_CHECKING:
    from noisydml.methods.parts.pml import PMLBaseline

PPMS = ("softmax", "mean", "max", "transproto")
POSITIVE_RULES = ("both", "bottom_up", "top_down")
#: Eqs. 14-15's subgroup conditions: those of the labellings the positives come from (A19), or c^B and c^T always
NEGATIVE_RULES = ("positives", "both")
POSITIVE_SOURCES = ("bank", "forward")

SGM_SCHEMA = {
    "thresholds": Field(str, "absolute", choices=("absolute", "quantile"),
                        help="ours: absolute = lambda_max, lambda_min and merge_min_similarity are cosine similarities; "
                             "quantile = quantile levels in [0, 1] of the intra-class nearest-neighbour similarities "
                             "(noisy labels) of each SGM pass's features (the spec's A15 option)"),
    "lambda_max": Field(float, 0.6, min=-1.0, max=1.0,
                        help="Eq. 4: intra-class links above this similarity (paper: none; 0.6 from the authors' config)"),
    "lambda_min": Field(float, 0.3, min=-1.0, max=1.0, help="Alg. 1 l.6: intra-class edges below this are pruned (ours)"),
    "merge_min_similarity": Field(float, 0.5, min=-1.0, max=1.0,
                                  help="lambda'_min: bottom-up merging stops below this centroid similarity (ours)"),
    "meta_merge_similarity": Field(float, 1.0, min=-1.0, max=1.0,
                                   help="lambda'_max: two meta clusters merge only above it; 1.0 = never (Alg. 2)"),
    "tau_k_factor": Field(float, 1.0, min=0.0,
                          help="tau_k = factor x classes: merging stops at tau_k groups (A13; paper: 2 on real noise)"),
    "tau_max_factor": Field(float, 2.0, min=0.0, help="tau_max = factor x mean class size: the largest merge (ours)"),
    "cell_size_factor": Field(float, 2.0, min=0.0, help="B = factor x mean class size: top-down cells split from B (ours)"),
    "neighbours": Field(int, 32, min=1, help="bottom-up candidate pairs per centroid (exact Alg. 2 at >= M_c - 1; ours)"),
    "every_epochs": Field(int, 1, min=1, help="SGM runs at the start of every n-th epoch (ours: synchronous)"),
    "start_epoch": Field(int, 0, min=0, help="first epoch (0-based) with SGM and L_noise (ours; PCS's warm-up aside)"),
}
TRANSPROTO_SCHEMA = {
    "layers": Field(int, 3, min=1, help="decoder blocks (the paper: 3)"),
    "heads": Field(int, 4, min=1, help="attention heads (ours)"),
    "ffn_factor": Field(int, 2, min=1, help="FFN width = factor x embedding dim (ours)"),
    "conditioning": Field(int, 16, min=1, help="bank features of subgroup-mates attended to (ours)"),
}
AUTHORS_SCHEMA = {
    "selection_on_all": Field(bool, False,
                              help="authors' code: PCS again on all forwarded images into the same window; L_noise's "
                                   "anchors from it (needs positive_source forward)"),
    "clean_loss_on_all": Field(bool, False,
                               help="authors' code: L_clean a second time on every image the second PCS call keeps "
                                    "(needs selection_on_all)"),
    "positives_update_bank": Field(bool, False,
                                   help="authors' code: the forwarded positives' features update their bank rows "
                                        "(Eq. 3) too (needs positive_source forward)"),
}
SGPS_SCHEMA = {
    "positives_per_sample": Field(int, 4, min=1, help="K: positives per rejected sample (Sec. IV-E: 4)"),
    "positive_source": Field(str, "bank", choices=POSITIVE_SOURCES,
                             help="the positives' embeddings: the feature bank's, detached (A2, ours) or K extra "
                                  "images per batch item forwarded with gradient (forward: the authors' code)"),
    "positives": Field(str, "both", choices=POSITIVE_RULES,
                       help="candidates: c^B- and c^T-mates (both, A3) or one side only (Fig. 5a)"),
    "negatives": Field(str, "positives", choices=NEGATIVE_RULES,
                       help="Eqs. 14-15: a negative's c^B / c^T must differ for the labellings the positives come "
                            "from (positives, A19) or for both whatever the positives (both, ours: separates Fig. "
                            "5a's positives from its negative mask)"),
    "ppm": Field(str, "softmax", choices=PPMS, help="the prototype (Eqs. 7-9 or TransProto; A23: softmax)"),
    "temperature": Field(float, 0.02, min=1e-6, help="tau of Eq. 13 (Table V: 0.02)"),
    "margin": Field(float, 0.1, help="delta of Eq. 13 (Table V: 0.1)"),
    "gamma_batch": Field(float, 1.0, min=0.0, help="gamma_1 of Eq. 16 (Table V: 1.0)"),
    "gamma_bank": Field(float, 0.1, min=0.0, help="gamma_2 of Eq. 16 (Table V: 0.1)"),
    "bank_momentum": Field(float, 0.9, min=0.0, max=1.0,
                           help="alpha of Eq. 3, the weight of the new feature (authors' config 0.9; A8)"),
    "sgm": Field(dict, {k: f.default for k, f in SGM_SCHEMA.items()}),
    "transproto": Field(dict, {k: f.default for k, f in TRANSPROTO_SCHEMA.items()}),
    "authors": Field(dict, {k: f.default for k, f in AUTHORS_SCHEMA.items()},
                     help="the authors' training-loop options (off: the paper's loop)"),
}


def ppm_mean(positives: torch.Tensor) -> torch.Tensor:
    """Eq. 7, normalised (A4): ``(A, K, D) -> (A, D)``."""
    return F.normalize(positives.mean(dim=1), dim=1)


def ppm_max(positives: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Eq. 8: the positive most similar to its anchor."""
    best = torch.einsum("akd,ad->ak", positives, anchors.detach()).argmax(dim=1)
    return F.normalize(positives[torch.arange(len(positives)), best], dim=1)


def ppm_softmax(positives: torch.Tensor) -> torch.Tensor:
    """Eq. 9: ``softmax((1/K) (F F^T - I) 1)^T F``, normalised (A4)."""
    k = positives.shape[1]
    corr = positives @ positives.transpose(1, 2) - torch.eye(k, dtype=positives.dtype, device=positives.device)
    weights = torch.softmax(corr.sum(dim=2) / k, dim=1)
    return F.normalize(torch.einsum("ak,akd->ad", weights, positives), dim=1)


class TransProto(nn.Module):
    """TransProto (Sec. III-E, Fig. 4): decoder blocks over the positives, conditioned on subgroup-mates' bank
    features; ``normalize(sum_k out_k)``. The residual branches' output layers start at zero (ours): at
    initialisation the prototype is the normalised Mean of Eq. 7."""

    def __init__(self, dim: int, layers: int, heads: int, ffn_factor: int):
        super().__init__()
        if dim % heads:
            raise ParamsError(f"transproto.heads: {heads} does not divide the embedding dim {dim}; allowed: a "
                              "divisor of train.embedding_dim")
        block = nn.TransformerDecoderLayer(dim, heads, dim_feedforward=ffn_factor * dim, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(block, layers)
        for layer in self.decoder.layers:
            for out in (layer.self_attn.out_proj, layer.multihead_attn.out_proj, layer.linear2):
                nn.init.zeros_(out.weight)
                nn.init.zeros_(out.bias)

    def forward(self, positives: torch.Tensor, conditioning: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.decoder(positives, conditioning).sum(dim=1), dim=1)


class Groups:
    """Members of every group of one labelling, for drawing positives without scanning all rows."""

    def __init__(self, labels: np.ndarray):
        self.labels = labels
        self.order = np.argsort(labels, kind="stable")
        counts = np.bincount(labels)
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.counts = counts

    def padded_members(self, rows: np.ndarray) -> np.ndarray:
        """The members of each row's group, ``(len(rows), largest of their groups)``, padded with -1."""
        groups = self.labels[rows]
        counts = self.counts[groups]
        width = int(counts.max(initial=0))
        offsets = np.arange(width)
        position = self.starts[groups][:, None] + offsets[None, :]
        inside = offsets[None, :] < counts[:, None]
        return np.where(inside, self.order[np.minimum(position, len(self.order) - 1)], -1)


class SgpsMethod(PrismMethod):
    """PCS + clean loss (:class:`PrismMethod`) + L_noise on the rejected samples; see the module docstring."""

    def __init__(self, setup: MethodSetup, base: "PMLBaseline | None"):
        super().__init__(setup, base)
        hp = setup.hparams
        n, d = setup.dataset_size, setup.embedding_dim
        self.register_buffer("bank", torch.zeros(n, d))
        self.register_buffer("bottom_up_labels", torch.zeros(n, dtype=torch.long))
        self.register_buffer("top_down_labels", torch.zeros(n, dtype=torch.long))
        self.register_buffer("sgm_round", torch.zeros((), dtype=torch.long))
        #: the positives drawn for each row this epoch (its last visit as a rejected sample; -1: none)
        self.register_buffer("drawn", torch.full((n, hp["positives_per_sample"]), -1, dtype=torch.long))
        tp = hp["transproto"]
        self.transproto = TransProto(d, tp["layers"], tp["heads"], tp["ffn_factor"]) if hp["ppm"] == "transproto" else None
        self._pools: tuple[Groups, ...] = ()

    # ------------------------------------------------------------------ SGM

    def _uses(self) -> tuple[bool, bool]:
        """Whether the positives are drawn from c^B-mates, from c^T-mates."""
        rule = self.hparams["positives"]
        return rule in ("both", "bottom_up"), rule in ("both", "top_down")

    def _masks(self) -> tuple[bool, bool]:
        """Whether Eqs. 14-15 ask a negative's c^B, its c^T, to differ from the anchor's (``negatives``). The mask
        always covers what the positives draw from, so ``[1]`` is also whether SGM has to compute c^T at all."""
        return (True, True) if self.hparams["negatives"] == "both" else self._uses()

    def _set_pools(self) -> None:
        use_b, use_t = self._uses()
        pools = []
        if use_b:
            pools.append(Groups(self.bottom_up_labels.cpu().numpy()))
        if use_t:
            pools.append(Groups(self.top_down_labels.cpu().numpy()))
        self._pools = tuple(pools)

    def on_train_start(self, ctx: EpochContext, restored: bool) -> None:
        if not restored:  # A8: the whole bank from one pass (stage 3 of the posterior chain: stage 2's features)
            self.bank.copy_(F.normalize(ctx.embed_train().float(), dim=1).to(self.bank.device))
        if int(self.sgm_round) > 0:
            self._set_pools()

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        logs = super().on_epoch_start(ctx)
        self.drawn.fill_(-1)
        sgm = self.hparams["sgm"]
        if ctx.epoch < sgm["start_epoch"] or (ctx.epoch - sgm["start_epoch"]) % sgm["every_epochs"]:
            return logs
        rng = np.random.default_rng([self.setup.seed, int(self.sgm_round), 3])
        t0 = time.perf_counter()
        stats = self._on_one_rank(lambda: self._sgm_labels(sgm, rng), (self.bottom_up_labels, self.top_down_labels))
        print(f"SGM round {int(self.sgm_round) + 1}: {int(stats['subgroups'])} subgroups, "
              f"{int(stats['bottom_up_groups'])} bottom-up groups"
              + (f", {int(stats['top_down_cells'])} top-down cells" if self._masks()[1] else "")
              + f" in {time.perf_counter() - t0:.2f} s")
        self.sgm_round += 1
        self._set_pools()
        logs.update({f"sgm_{k}": v for k, v in stats.items()})
        return logs

    #: SGM's counts, logged per round (the same on every process)
    SGM_STATS = ("subgroups", "meta", "bottom_up_groups", "top_down_cells", "merges", "rejected_meta", "rejected_size",
                 "threshold_lambda_max", "threshold_lambda_min", "threshold_merge_min_similarity")

    def _sgm_labels(self, sgm: dict, rng: np.random.Generator) -> dict[str, float]:
        """One SGM round on the bank into ``bottom_up_labels`` / ``top_down_labels``; its counts."""
        # Alg. 2's candidate search grows as the square of the subgroups: on the GPU when the bank is there
        result = run_sgm(self.bank.cpu().numpy(), self.setup.train_labels, sgm, rng,
                         top_down_labels=self._masks()[1], use_gpu=self.bank.is_cuda)
        self.bottom_up_labels.copy_(torch.from_numpy(result.bottom_up))
        self.top_down_labels.copy_(torch.from_numpy(result.top_down))
        return {k: float(result.stats.get(k, 0)) for k in self.SGM_STATS}

    def _on_one_rank(self, work, shared: tuple[torch.Tensor, ...]) -> dict[str, float]:
        """``work()`` (which fills the tensors ``shared`` and returns counts) on rank 0 only, its tensors and counts
        then sent to every rank: under DDP every rank holds the same bank (its replica), so SGM's result is the
        same everywhere, and running it once keeps one pass's memory on the node, not one per process (at MS1MV0's
        10M rows ~100 GiB each). One process: ``work()`` as it is."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return work()
        device = shared[0].device
        counts = torch.zeros(len(self.SGM_STATS), dtype=torch.float64, device=device)
        if dist.get_rank() == 0:
            done = work()
            counts = torch.tensor([done[k] for k in self.SGM_STATS], dtype=torch.float64, device=device)
        for tensor in (*shared, counts):
            dist.broadcast(tensor, src=0)
        return dict(zip(self.SGM_STATS, counts.tolist()))

    # ------------------------------------------------------------------ positives and prototypes

    def draw_positives(self, rows: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """K positives per row (A3) and, for TransProto, ``conditioning`` subgroup-mates (-1 where none).

        Uniform over the row's candidates (its mates in the pools in use, each once, itself excluded): without
        replacement (random keys, the K smallest) when it has at least K, with replacement otherwise. Seeded by
        (seed, step), so a resumed run draws the same; no Python loop over rows."""
        k = self.hparams["positives_per_sample"]
        c = self.hparams["transproto"]["conditioning"] if self.transproto is not None else 0
        rng = np.random.default_rng([self.setup.seed, step, 11])
        mates = np.concatenate([p.padded_members(rows) for p in self._pools], axis=1)  # (A, M), -1 padding
        mates = np.where(mates == rows[:, None], -1, mates)
        if len(self._pools) > 1:  # a row in both pools counts once
            mates = np.sort(mates, axis=1)
            mates[:, 1:][mates[:, 1:] == mates[:, :-1]] = -1
        valid = mates >= 0
        count = valid.sum(axis=1)
        keys = np.where(valid, rng.random(mates.shape), np.inf)
        shuffled = np.take_along_axis(mates, np.argsort(keys, axis=1, kind="stable"), axis=1)  # valid ones first
        width = max(k, c, 1)
        if shuffled.shape[1] < width:
            shuffled = np.pad(shuffled, ((0, 0), (0, width - shuffled.shape[1])), constant_values=-1)
        # fewer than needed: draw with replacement among the valid ones (the first `count` of the shuffle)
        with_replacement = np.floor(rng.random((len(rows), width)) * np.maximum(count, 1)[:, None]).astype(np.int64)
        positives = np.where((count >= k)[:, None], shuffled[:, :k],
                             np.take_along_axis(shuffled, with_replacement[:, :k], axis=1))
        positives[count == 0] = -1
        conditioning = np.full((len(rows), max(c, 1)), -1, np.int64)
        if c:
            conditioning = np.where((count >= c)[:, None], shuffled[:, :c],
                                    np.take_along_axis(shuffled, with_replacement[:, :c], axis=1))
            conditioning[count == 0] = -1
        return positives, conditioning

    def extra_samples(self, rows: np.ndarray, epoch: int, step: int) -> ExtraRows | None:
        """``positive_source: forward``: K positives for every batch row (the authors' loader: 64 items -> 320
        images), flattened row by row; a row without candidates forwards itself K times as a placeholder (never
        used: it has no positive). ``drawn``: (batch rows, positives, conditioning), back on ``batch.extra``.
        Before the first SGM round there are no subgroups: nothing extra."""
        if self.hparams["positive_source"] != "forward" or int(self.sgm_round) == 0:
            return None
        positives, conditioning = self.draw_positives(rows, step)
        return ExtraRows(np.where(positives >= 0, positives, rows[:, None]).reshape(-1),
                         drawn=(rows.copy(), positives, conditioning))

    def _positive_embeddings(self, batch: Batch, anchors: torch.Tensor, rows: np.ndarray):
        """The drawn positives (A, K) and conditioning of the anchors (batch positions ``anchors``, training rows
        ``rows``), and the positives' embeddings as a callable of a mask over anchors: bank features (detached)
        or the forwarded images' embeddings (with gradient)."""
        if self.hparams["positive_source"] == "bank":
            positives, conditioning = self.draw_positives(rows, batch.step)
            return positives, conditioning, lambda keep: self.bank[torch.from_numpy(positives[keep]).to(self.bank.device)]
        extra = batch.extra
        forwarded = extra.request.drawn if extra is not None and extra.request is not None else None
        k = self.hparams["positives_per_sample"]
        if forwarded is None or extra is None or not np.array_equal(forwarded[0], batch.index.cpu().numpy()) \
                or len(extra.index) != k * len(batch.index):
            raise RuntimeError("sgps positive_source forward: the batch did not come with the positives "
                               "extra_samples() asked for (a trainer that does not forward Method.extra_samples?)")
        at = anchors.cpu().numpy()
        positives, conditioning = forwarded[1][at], forwarded[2][at]
        embeddings = extra.embeddings.reshape(len(batch.index), k, -1)[anchors]
        return positives, conditioning, lambda keep: embeddings[torch.from_numpy(keep).to(embeddings.device)]

    def prototypes(self, positives: torch.Tensor, anchors: torch.Tensor, conditioning: torch.Tensor | None):
        ppm = self.hparams["ppm"]
        if ppm == "mean":
            return ppm_mean(positives)
        if ppm == "max":
            return ppm_max(positives, anchors)
        if ppm == "softmax":
            return ppm_softmax(positives)
        return self.transproto(positives, conditioning)

    def _negative_mask(self, anchor_rows: torch.Tensor, anchor_labels: torch.Tensor, other_rows: torch.Tensor,
                       other_labels: torch.Tensor) -> torch.Tensor:
        """Eq. 14: the noisy label, c^B and c^T (those in use, A19; both with ``negatives: both``) all differ from
        the anchor's."""
        use_b, use_t = self._masks()
        mask = anchor_labels[:, None] != other_labels[None, :]
        if use_b:
            mask &= self.bottom_up_labels[anchor_rows][:, None] != self.bottom_up_labels[other_rows][None, :]
        if use_t:
            mask &= self.top_down_labels[anchor_rows][:, None] != self.top_down_labels[other_rows][None, :]
        return mask

    def _contrast(self, z: torch.Tensor, positive_logit: torch.Tensor, others: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
        """Eq. 13 per anchor, then the mean (A21); an anchor with no negative contributes -log 1 = 0."""
        logits = (z @ others.T) / self.hparams["temperature"]
        logits = logits.masked_fill(~mask, float("-inf"))
        all_logits = torch.cat([positive_logit[:, None], logits], dim=1)
        return (torch.logsumexp(all_logits, dim=1) - positive_logit).mean()

    def noise_loss(self, batch: Batch, keep: torch.Tensor):
        """L_noise on the rejected queries; with the authors' options, on those their second PCS call rejects, plus
        their second L_clean."""
        authors = self.hparams["authors"]
        if not (authors["selection_on_all"] and batch.extra is not None):
            return self._noise_term(batch, keep)
        fell_back = self.threshold.fell_back  # the query call's, as PRISM logs it
        images = torch.cat([batch.embeddings, batch.extra.embeddings])
        labels = torch.cat([batch.labels, batch.extra.labels])
        keep_all = self.select(images, labels, batch.step)  # the second Q_t enters the same window
        self.threshold.fell_back = fell_back
        value, logs = self._noise_term(batch, keep_all[: len(keep)])
        logs["sgps_anchor_disagreement"] = float((keep_all[: len(keep)] != keep).float().mean())
        if authors["clean_loss_on_all"]:
            term = clean_loss_without_enqueue(self.base, images[keep_all], labels[keep_all], batch.step,
                                              batch_size=len(images))
            value = value + term
            logs["sgps_clean_all"] = float(term.detach())
        return value, logs

    def _noise_term(self, batch: Batch, keep: torch.Tensor):
        """Eqs. 13-16 on the batch rows ``~keep`` that have positives."""
        hp = self.hparams
        zero = batch.embeddings.sum() * 0.0
        logs = {"sgps_noise_batch": 0.0, "sgps_noise_bank": 0.0, "sgps_anchor_fraction": 0.0,
                "sgps_anchors_with_positives": 0.0}
        anchors = torch.nonzero(~keep).squeeze(1)
        if int(self.sgm_round) == 0 or len(anchors) == 0:
            return zero, logs
        rows = batch.index[anchors]
        positives, conditioning, positive_embeddings = self._positive_embeddings(batch, anchors, rows.cpu().numpy())
        with_positive = positives[:, 0] >= 0  # anchors with at least one drawn positive
        has = torch.from_numpy(with_positive).to(keep.device)
        logs["sgps_anchor_fraction"] = len(anchors) / len(keep)
        logs["sgps_anchors_with_positives"] = float(has.float().mean())
        self.drawn[rows] = torch.from_numpy(positives).to(self.drawn.device)
        if not has.any():
            return zero, logs
        anchors, rows = anchors[has], rows[has]
        z = batch.embeddings[anchors]
        cond = self.bank[torch.from_numpy(conditioning[with_positive]).to(self.bank.device)] if self.transproto is not None else None
        proto = self.prototypes(positive_embeddings(with_positive), z, cond)
        positive_logit = ((z * proto).sum(dim=1) - hp["margin"]) / hp["temperature"]
        labels = batch.labels[anchors]
        value = zero
        if hp["gamma_batch"]:
            mask = self._negative_mask(rows, labels, batch.index, batch.labels)
            term = self._contrast(z, positive_logit, batch.embeddings, mask)
            value = value + hp["gamma_batch"] * term
            logs["sgps_noise_batch"] = float(term.detach())
        if hp["gamma_bank"]:
            filled = self.memory.labels >= 0  # an empty slot is never a negative
            mask = self._negative_mask(rows, labels, self.memory.rows.clamp(min=0), self.memory.labels) & filled
            term = self._contrast(z, positive_logit, self.memory.features.clone(), mask)  # enqueue writes in place
            value = value + hp["gamma_bank"] * term
            logs["sgps_noise_bank"] = float(term.detach())
        return value, logs

    def on_step_end(self, ctx: EpochContext, batch: Batch) -> None:
        self._update_bank(batch)

    @torch.no_grad()
    def _update_bank(self, batch: Batch) -> None:
        """Eq. 3, alpha on the new feature (A8), re-normalised: the batch's rows; with ``positives_update_bank`` then
        the forwarded positives' rows that are not batch rows, each once (its first forwarded image)."""
        alpha = self.hparams["bank_momentum"]
        rows, embeddings = batch.index, batch.embeddings
        if self.hparams["authors"]["positives_update_bank"] and batch.extra is not None:
            extra_rows = batch.extra.index.cpu().numpy()
            _, first = np.unique(extra_rows, return_index=True)
            first = np.sort(first)
            first = first[~np.isin(extra_rows[first], batch.index.cpu().numpy())]
            at = torch.from_numpy(first).to(batch.extra.index.device)
            rows = torch.cat([rows, batch.extra.index[at]])
            embeddings = torch.cat([embeddings, batch.extra.embeddings[at]])
        new = F.normalize(embeddings.detach().float(), dim=1)
        self.bank[rows] = F.normalize(alpha * new + (1.0 - alpha) * self.bank[rows], dim=1)

    # ------------------------------------------------------------------ decisions and exports

    def decisions(self) -> Decisions:
        out = super().decisions()
        if int(self.sgm_round) == 0:
            return out
        use_b, use_t = self._uses()
        groups = {}
        if use_b:
            groups["bottom_up"] = self.bottom_up_labels.cpu().numpy()
        if use_t:
            groups["top_down"] = self.top_down_labels.cpu().numpy()
        return Decisions(keep=out.keep, visits=out.visits, groups=groups, positives=self.drawn.cpu().numpy())

    def export(self, ctx: EpochContext) -> dict[str, np.ndarray]:
        """PRISM's keep, and ``c^B`` of a fresh Alg. 1 + 2 pass on the final model (Sec. IV-E's stage-1 labels)."""
        out = super().export(ctx)
        features = F.normalize(ctx.embed_train().float(), dim=1).numpy()  # every rank: the pass gathers
        labels = torch.zeros(len(features), dtype=torch.long, device=self.bottom_up_labels.device)

        def fresh_pass() -> dict[str, float]:
            result = run_sgm(features, self.setup.train_labels, self.hparams["sgm"],
                             np.random.default_rng([self.setup.seed, 0, 5]), top_down_labels=False)
            labels.copy_(torch.from_numpy(result.bottom_up))
            return {k: float(result.stats.get(k, 0)) for k in self.SGM_STATS}

        self._on_one_rank(fresh_pass, (labels,))
        bottom_up = labels.cpu().numpy()
        sizes = np.bincount(bottom_up)
        out["bottom_up_label"] = bottom_up
        out["bottom_up_keep"] = (sizes[bottom_up] >= 2).astype(np.int64)  # A27: no singleton classes
        return out


def clean_loss_without_enqueue(base, embeddings: torch.Tensor, labels: torch.Tensor, step: int,
                               batch_size: int) -> torch.Tensor:
    """The clean loss of ``embeddings`` (:class:`~noisydml.methods.parts.pml.PMLMethod` ``base``) against each other
    and, for XBM's memory, against the memory as it is, without enqueueing them (the authors' ``loss_pr_all``:
    their batch term over the kept images plus their bank term against the memory of earlier steps)."""
    fn = base.loss_fn
    if len(embeddings) == 0:
        return embeddings.sum() * 0.0
    if not isinstance(fn, pml_losses.CrossBatchMemory) or step < base.hparams["memory_warmup_steps"]:
        wrapped = fn.loss if isinstance(fn, pml_losses.CrossBatchMemory) else fn
        value = wrapped(embeddings, labels)
    else:
        end = len(fn.embedding_memory) if fn.has_been_filled else fn.queue_idx
        reference = torch.cat([embeddings, fn.embedding_memory[:end].to(embeddings.device, embeddings.dtype)])
        reference_labels = torch.cat([labels, fn.label_memory[:end].to(labels.device, labels.dtype)])
        a1, p, a2, n = lmu.get_all_pairs_indices(labels, reference_labels)
        not_self = a1 != p  # the first rows of the reference are the embeddings themselves
        value = fn.loss(embeddings, labels, (a1[not_self], p[not_self], a2, n), reference, reference_labels)
    return value / batch_size if base.sum_over_batch else value


def check_sgps(hp: dict, where: str) -> None:
    """Checks across SGPS's keys (``validate`` of every SGPS method's spec)."""
    if hp["sgm"]["thresholds"] == "quantile":
        for key in ("lambda_max", "lambda_min", "merge_min_similarity"):
            if not 0.0 <= hp["sgm"][key] <= 1.0:
                raise ParamsError(f"{where}.sgm.{key}: {hp['sgm'][key]} with thresholds: quantile; allowed: a quantile "
                                  "level in [0, 1]")
    if hp["sgm"]["lambda_min"] > hp["sgm"]["lambda_max"]:
        raise ParamsError(f"{where}.sgm.lambda_min: {hp['sgm']['lambda_min']} is above lambda_max "
                          f"{hp['sgm']['lambda_max']}; allowed: lambda_min <= lambda_max (Alg. 1)")
    if hp["noise_rate"] == 0:
        raise ParamsError(f"{where}.noise_rate: 0 rejects nothing, so L_noise never applies; allowed: (0, 0.99]")
    authors = hp["authors"]
    for key in ("selection_on_all", "positives_update_bank"):
        if authors[key] and hp["positive_source"] != "forward":
            raise ParamsError(f"{where}.authors.{key}: true needs forwarded positives, but {where}.positive_source "
                              f"is {hp['positive_source']!r}; allowed: positive_source: forward, or {key}: false")
    if authors["clean_loss_on_all"] and not authors["selection_on_all"]:
        raise ParamsError(f"{where}.authors.clean_loss_on_all: true needs the second selection that chooses its "
                          f"images; allowed: authors.selection_on_all: true, or clean_loss_on_all: false")


#: :meth:`SgpsMethod.export`'s arrays: PRISM's, and Alg. 1 + 2's c^B on the final model.
SGPS_EXPORTS = ("keep_fraction", "keep", "bottom_up_label", "bottom_up_keep")


def sgps_spec(base: "PMLBaseline", description: str) -> MethodSpec:
    """SGPS around the pml loss ``base`` (L_clean; :class:`~noisydml.methods.parts.pml.PMLBaseline`)."""
    from noisydml.methods.parts.pml import loss_schema

    schema = {**selector_schema(base), **SGPS_SCHEMA}

    return MethodSpec(
        build=lambda setup: SgpsMethod(setup, base),
        schema=schema,
        description=description,
        nested={"loss": loss_schema(base), "sgm": SGM_SCHEMA, "transproto": TRANSPROTO_SCHEMA,
                "authors": AUTHORS_SCHEMA},
        validate=check_sgps,
        exports=SGPS_EXPORTS,
    )
