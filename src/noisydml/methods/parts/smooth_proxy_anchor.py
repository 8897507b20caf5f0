"""Smooth Proxy-Anchor (Roig, Varas, Masuda, Riveiro, Bou-Balust; CVPR 2020 workshop, arXiv 2006.05142).

**What is stated, and where** (``../shared/papers/smooth-proxy-anchor-notes.md``; tags as there):

- [P] the paper's excerpt: two phases. Phase 1 trains a *confidence module* that gives every sample a
  confidence per class; phase 2 uses the confidences to weight each sample's influence on the embedding
  (Fig. 1: noisy labels -> samples relabelled by class confidences -> proxies selected for the relabelled
  samples -> the Proxy-Anchor loss smoothly weighted by the confidences). A sample matched to no class still
  separates from the classes. The confidence module is dropped at inference. The excerpt calls its objective
  "a multi-class classification objective".
- [S] the authors' slides only: ResNet-50, ImageNet-pretrained, classifier removed, **frozen in all
  experiments**; the confidence module trained with **binary cross-entropy**; a smoothing function with a
  *position* and a *sharpness* parameter; a sample is a positive of a proxy when its confidence for it passes
  a threshold, otherwise a negative.
- The paper's equations are not in our copy and no code is public, so **every formula below is our
  reconstruction [R]**, each a parameter:

  - smoothing ``S(c) = sigmoid(sharpness * (c - position))`` (``sharpness`` 10, ``position`` 0.5: values ours);
    ``hard: true`` makes it the step ``c >= position``; ``smoothing: one_sided`` makes it ``min(1, 2 S(c))``, so a
    sample at or above the position keeps its whole weight and only doubtful ones lose weight (whether clean
    samples can lose weight: the text does not say); ``ramp_epochs: n`` phases the weights in over phase 2's
    first n epochs (``1 - r (1 - w)``, r from 0 to 1: a schedule of phase 2 the text leaves open);
  - relabelling: the positive proxies of x are ``{p : c(x, p) >= tau}`` (``tau`` 0.5, ours); the given label is
    dropped when its confidence is below ``tau``; a sample with no positive proxy is a negative of every proxy;
  - the loss (Proxy-Anchor's, Kim et al. 2020, Eq. 4 there, with ``alpha`` 32 and ``margin`` delta 0.1 from
    Kim et al., not from Roig et al.), with each term weighted inside its log-sum::

        L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} S+(x, p) e^{-alpha (s(x, p) - delta)})
          + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} S-(x, p) e^{ alpha (s(x, p) + delta)})

    where ``X_p+`` are the batch samples relabelled positive for p, ``X_p- `` the others, ``P+`` the proxies
    with at least one positive in the batch, ``S+(x, p) = S(c(x, p))`` (``weighting: pair``) or
    ``S(max_q c(x, q))`` (``weighting: sample``: one weight per sample, the excerpt's "individual contribution
    of each sample"), and ``S-(x, p) = 1 - S(c(x, p))`` (``weight_negatives: true``; not attested anywhere) or 1.
    With one-hot confidences of the given labels and a hard step this is exactly pytorch-metric-learning's
    ``ProxyAnchorLoss`` (tested);
  - objective ``bce`` (one-vs-all, the slides) or ``softmax`` (the excerpt's wording). With softmax at most one
    class can pass 0.5, so ``tau`` 0.5 then keeps at most one positive per sample;
  - confidences are computed once at the end of phase 1 (eval mode, no augmentation) and exported per sample as
    the ``top_k`` largest (sparse for many classes), with the labels they were computed for; phase 2 takes them
    as inputs of a chained run and refuses confidences of other labels.

The backbone is frozen (with frozen batch-norm statistics) in both phases by default, as the slides say;
``freeze_backbone: false`` fine-tunes it, for comparison with the methods that do. Freezing a randomly
initialised backbone makes both phases meaningless: the config refuses ``freeze_backbone`` with
``train.pretrained: none``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import nn

from noisydml.methods.base import Batch, Decisions, EpochContext, Method, MethodSetup, Trainable
from noisydml.schema import Field

OBJECTIVES = ("bce", "softmax")
WEIGHTINGS = ("pair", "sample")
SIDES = ("two_sided", "one_sided")
#: What phase 1 exports and phase 2 takes (the chain's ``inputs``).
EXPORTS = ("confidence_classes", "confidence_values", "confidence_label")

FREEZE_FIELD = Field(bool, True, help="train with the backbone frozen and its batch-norm statistics fixed (the "
                                       "authors' slides [S]); false fine-tunes it (ours, for comparison)")
HEAD_LR_FIELD = Field(float, 1.0, min=0.0, help="the embedding head's learning rate / train's: with the backbone "
                                                "frozen the head is all that learns (ours; tuned on validation)")

CONFIDENCE_SCHEMA = {
    "objective": Field(str, "bce", choices=OBJECTIVES,
                       help="bce: one-vs-all binary cross-entropy (the slides [S]); softmax: cross-entropy over the "
                            "classes (the excerpt's 'multi-class classification objective' [P])"),
    "hidden": Field(int, 0, min=0, help="width of one hidden ReLU layer of the confidence module; 0 = linear (ours)"),
    "top_k": Field(int, 16, min=1, help="confidences exported per sample: its k largest (ours)"),
    "freeze_backbone": FREEZE_FIELD,
    "lr_multiplier": Field(float, 40.0, min=0.0, help="the confidence module's learning rate / train's (ours)"),
}

SMOOTH_PA_SCHEMA = {
    "loss": Field(dict, {"alpha": 32.0, "margin": 0.1}),
    "sharpness": Field(float, 10.0, min=0.0, help="k of S(c) = sigmoid(k (c - c0)) ([S] names it; value ours [R])"),
    "position": Field(float, 0.5, help="c0 of S(c) ([S] names it; value ours [R])"),
    "hard": Field(bool, False, help="S(c) = step(c >= position) instead of the sigmoid (the unit test's case)"),
    "smoothing": Field(str, "two_sided", choices=SIDES,
                       help="two_sided: S(c) = sigmoid(k (c - c0)), every sample loses some weight (ours [R]); "
                            "one_sided: min(1, 2 sigmoid(k (c - c0))), samples at or above c0 keep weight 1 (ours [R])"),
    "ramp_epochs": Field(int, 0, min=0,
                         help="phase 2's schedule (ours [R]): every weight w enters as 1 - r (1 - w), r rising "
                              "linearly from 0 to 1 over the first ramp_epochs epochs; 0 = the weights from the start"),
    "tau": Field(float, 0.5, min=0.0, max=1.0, help="a proxy is positive for x when c(x, p) >= tau ([S]; value ours [R])"),
    "weighting": Field(str, "pair", choices=WEIGHTINGS,
                       help="positive terms weighted by S(c(x, p)) (pair, ours [R]) or by S(max_q c(x, q)) (sample)"),
    "weight_negatives": Field(bool, True, help="negative terms weighted by 1 - S(c(x, p)) (ours [R]) or by 1"),
    "freeze_backbone": FREEZE_FIELD,
    "head_lr_multiplier": HEAD_LR_FIELD,
    "lr_multiplier": Field(float, 100.0, min=0.0, help="proxies' learning rate / train's (Kim et al.'s 100)"),
}
LOSS_SCHEMA = {"alpha": Field(float, 32.0, min=0.0), "margin": Field(float, 0.1)}


def frozen_backbone(freeze: bool, *also: str) -> Trainable:
    """The model parts a phase freezes: the backbone (with fixed batch-norm statistics) when ``freeze``."""
    return Trainable(frozen=(("backbone",) if freeze else ()) + also, freeze_batchnorm=freeze)


class FrozenBackbone:
    """For a method with ``freeze_backbone`` and ``head_lr_multiplier`` (phase 2 and its Proxy-Anchor baseline):
    the backbone frozen with fixed batch-norm statistics, the embedding head at its own learning rate."""

    def trainable(self, epoch: int) -> Trainable:
        return frozen_backbone(self.hparams["freeze_backbone"])

    def head_lr_factor(self) -> float:
        return float(self.hparams["head_lr_multiplier"])


def smoothing(c: torch.Tensor, sharpness: float, position: float, hard: bool = False,
              one_sided: bool = False) -> torch.Tensor:
    """``S(c) = sigmoid(sharpness (c - position))`` [R]; the step ``c >= position`` when ``hard``; with
    ``one_sided``, ``min(1, 2 sigmoid(...))``: 1 from the position up (a confident sample keeps its whole weight),
    continuous there, falling to 0 below it [R]."""
    if hard:
        return (c >= position).to(c.dtype)
    if one_sided:
        return (2.0 * torch.sigmoid(sharpness * (c - position))).clamp(max=1.0)
    return torch.sigmoid(sharpness * (c - position))


def relabel(confidences: torch.Tensor, tau: float) -> torch.Tensor:
    """(B, C) bool: the proxies each sample is a positive of, ``c(x, p) >= tau`` [R] (Fig. 1, step 2)."""
    return confidences >= tau


def dense_confidences(classes: torch.Tensor, values: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(B, C) confidences from the exported top-k (classes outside a sample's top-k count as 0)."""
    out = torch.zeros(len(classes), num_classes, dtype=values.dtype, device=values.device)
    return out.scatter_(1, classes, values)


def positive_weight(confidence: torch.Tensor, top_confidence: torch.Tensor, *, sharpness: float, position: float,
                    hard: bool, weighting: str, one_sided: bool = False) -> torch.Tensor:
    """The weight of x's positive term for a proxy of confidence ``c(x, p)`` [R]: ``S(c(x, p))`` (``pair``) or
    ``S(max_q c(x, q))`` (``sample``; ``top_confidence`` is that maximum)."""
    return smoothing(top_confidence if weighting == "sample" else confidence, sharpness, position, hard, one_sided)


def smooth_proxy_anchor_loss(cos: torch.Tensor, confidences: torch.Tensor, *, alpha: float, margin: float,
                             tau: float, sharpness: float, position: float, hard: bool = False,
                             weighting: str = "pair", weight_negatives: bool = True, one_sided: bool = False,
                             ramp: float = 1.0):
    """The confidence-weighted Proxy-Anchor loss [R] (module docstring) of cosine similarities ``cos`` (B, C)
    between embeddings and proxies, given confidences (B, C). Returns ``(loss, logs)``."""
    positive = relabel(confidences, tau)
    pos_weight = positive_weight(confidences, confidences.max(dim=1, keepdim=True).values, sharpness=sharpness,
                                 position=position, hard=hard, weighting=weighting, one_sided=one_sided).expand_as(cos)
    neg_weight = (1.0 - smoothing(confidences, sharpness, position, hard, one_sided) if weight_negatives
                  else torch.ones_like(cos))
    if ramp < 1.0:  # phase 2's schedule: the weights phase in (ramp_epochs)
        pos_weight, neg_weight = 1.0 - ramp * (1.0 - pos_weight), 1.0 - ramp * (1.0 - neg_weight)
    # a weight enters as log w inside the log-sum; a zero weight drops the term (the weights carry no gradient)
    pos_keep, neg_keep = positive & (pos_weight > 0), ~positive & (neg_weight > 0)
    log_pos = torch.where(pos_keep, pos_weight.clamp_min(1e-30).log(), torch.zeros_like(cos))
    log_neg = torch.where(neg_keep, neg_weight.clamp_min(1e-30).log(), torch.zeros_like(cos))
    pos_term = lmu.logsumexp(-alpha * (cos - margin) + log_pos, keep_mask=pos_keep, add_one=True, dim=0)
    neg_term = lmu.logsumexp(alpha * (cos + margin) + log_neg, keep_mask=neg_keep, add_one=True, dim=0)
    with_positive = int(positive.any(dim=0).sum())
    loss = pos_term.sum() / max(with_positive, 1) + neg_term.sum() / cos.shape[1]
    logs = {"spa_no_positive_share": float((~positive.any(dim=1)).float().mean()),
            "spa_positives_per_sample": float(positive.sum(dim=1).float().mean())}
    return loss, logs


class ConfidenceModule(Method):
    """Phase 1 (``spa_confidence``, a grid run): a confidence module on the backbone's features, trained on the noisy labels.

    Exports, per row: the ``top_k`` largest confidences (``confidence_values``) and their classes
    (``confidence_classes``), computed on the final model in eval mode, and the label each row trained on
    (``confidence_label``), by which phase 2 checks they are its own. Decisions for judging: ``confidence`` =
    c(x, given label); ``pseudo_labels`` = the top-confidence class (relabelling accuracy); ``keep`` = the
    top-confidence class is the given label (so "flagged noisy" = top class != given label).
    """

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        if setup.feature_dim <= 0:
            raise ValueError("spa_confidence needs the backbone's feature width (MethodSetup.feature_dim)")
        hidden = self.hparams["hidden"]
        c = setup.num_classes
        self.classifier = (nn.Linear(setup.feature_dim, c) if hidden == 0 else
                           nn.Sequential(nn.Linear(setup.feature_dim, hidden), nn.ReLU(), nn.Linear(hidden, c)))
        n = setup.dataset_size
        self.register_buffer("given_confidence", torch.full((n,), float("nan")))
        self.register_buffer("top_class", torch.full((n,), -1, dtype=torch.long))

    def trainable(self, epoch: int) -> Trainable:
        # the embedding head plays no part in phase 1: it stays as initialised
        return frozen_backbone(self.hparams["freeze_backbone"], "head")

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) if self.hparams["objective"] == "bce" else logits.softmax(dim=1)

    def loss(self, batch: Batch):
        logits = self.classifier(batch.features)
        if self.hparams["objective"] == "bce":
            target = F.one_hot(batch.labels, self.setup.num_classes).to(logits.dtype)
            # one-vs-all: a sum over the classes, a mean over the batch
            loss = F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(logits)
        else:
            loss = F.cross_entropy(logits, batch.labels)
        return loss, {}

    @torch.no_grad()
    def confidences(self, ctx: EpochContext, k: int, block: int = 4096):
        """Top-k confidences of every row on the current model (eval mode), in row blocks: never N x C at once."""
        _, features = ctx.embed_train(features=True)
        was = self.training
        self.eval()
        labels = torch.tensor(self.setup.train_labels)  # a copy: the labels' array is read-only (no torch warning)
        k = min(k, self.setup.num_classes)
        values, classes, given = [], [], []
        for start in range(0, len(features), block):
            probs = self.probabilities(self.classifier(features[start:start + block].to(ctx.device))).float().cpu()
            v, c = probs.topk(k, dim=1)
            values.append(v)
            classes.append(c)
            given.append(probs.gather(1, labels[start:start + block, None]).squeeze(1))
        self.train(was)
        return torch.cat(values), torch.cat(classes), torch.cat(given)

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        if ctx.epoch + 1 < ctx.num_epochs:
            return {}  # judged on the final epoch only: a pass over the training set per epoch would cost ~10%
        values, classes, given = self.confidences(ctx, 1)
        self.given_confidence.copy_(given.to(self.given_confidence.device))
        self.top_class.copy_(classes[:, 0].to(self.top_class.device))
        flagged = (self.top_class != torch.tensor(self.setup.train_labels, device=self.top_class.device))
        return {"spa_flagged_share": float(flagged.float().mean()), "spa_given_confidence": float(given.mean())}

    def decisions(self) -> Decisions | None:
        if bool(torch.isnan(self.given_confidence).all()):
            return None
        top = self.top_class.cpu().numpy()
        return Decisions(keep=(top == self.setup.train_labels).astype(np.float64),
                         pseudo_labels=top, confidence=self.given_confidence.cpu().numpy().astype(np.float64))

    def export(self, ctx: EpochContext) -> dict[str, np.ndarray]:
        values, classes, _ = self.confidences(ctx, self.hparams["top_k"])
        return {"confidence_classes": classes.numpy().astype(np.int64),
                "confidence_values": values.numpy().astype(np.float32),
                "confidence_label": np.asarray(self.setup.train_labels, dtype=np.int64)}


class SmoothProxyAnchor(FrozenBackbone, Method):
    """Phase 2 (``spa_smooth_loss``, trained as the chained run ``smooth_proxy_anchor``): Proxy-Anchor with proxies selected by, and terms weighted by, phase 1's
    confidences (a chained run whose ``inputs`` are phase 1's :data:`EXPORTS`).

    Decisions for judging: ``pseudo_labels`` = the top-confidence class when it passes ``tau`` (else -1: no
    positive proxy), ``keep`` = the given label survives relabelling, ``confidence`` = S(c(x, given label)), and
    ``weights`` = the weight of x's given-label positive term (0 when dropped).
    """

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        missing = [name for name in EXPORTS if name not in setup.inputs]
        if missing:
            raise ValueError(f"spa_smooth_loss trains on phase 1's confidences: a chained run from an "
                             f"spa_confidence run with inputs: [{', '.join(EXPORTS)}] (missing: {', '.join(missing)})")
        label = np.asarray(setup.inputs["confidence_label"])
        if label.shape != np.shape(setup.train_labels) or not np.array_equal(label, setup.train_labels):
            differ = int((label != setup.train_labels).sum()) if label.shape == np.shape(setup.train_labels) else len(label)
            raise ValueError(f"spa_smooth_loss: the confidences were computed for other labels ({differ} of "
                             f"{len(setup.train_labels)} rows differ): they belong to another noise setting, dataset "
                             "or label set; chain this run from the spa_confidence run of the same data")
        classes = np.asarray(setup.inputs["confidence_classes"])
        if classes.ndim != 2 or classes.min(initial=0) < 0 or classes.max(initial=0) >= setup.num_classes:
            raise ValueError(f"spa_smooth_loss: confidence_classes must be (rows, k) class ids in "
                             f"0..{setup.num_classes - 1}; got shape {classes.shape}, ids up to {classes.max(initial=0)}")
        self.register_buffer("conf_classes", torch.as_tensor(classes, dtype=torch.long), persistent=False)
        self.register_buffer("conf_values", torch.as_tensor(np.asarray(setup.inputs["confidence_values"]),
                                                            dtype=torch.float32), persistent=False)
        self.proxies = nn.Parameter(torch.empty(setup.num_classes, setup.embedding_dim))
        # pml's ProxyAnchorLoss initialisation (Kaiming normal, fan-out), from the run's seed
        nn.init.kaiming_normal_(self.proxies, mode="fan_out", generator=torch.Generator().manual_seed(int(setup.seed)))

    def batch_confidences(self, index: torch.Tensor) -> torch.Tensor:
        return dense_confidences(self.conf_classes[index], self.conf_values[index], self.setup.num_classes)

    def loss(self, batch: Batch):
        hp = self.hparams
        cos = batch.embeddings @ F.normalize(self.proxies, dim=1).T
        return smooth_proxy_anchor_loss(
            cos, self.batch_confidences(batch.index), alpha=hp["loss"]["alpha"], margin=hp["loss"]["margin"],
            tau=hp["tau"], sharpness=hp["sharpness"], position=hp["position"], hard=hp["hard"],
            weighting=hp["weighting"], weight_negatives=hp["weight_negatives"],
            one_sided=hp["smoothing"] == "one_sided",
            ramp=min(1.0, batch.epoch / hp["ramp_epochs"]) if hp["ramp_epochs"] else 1.0)

    def decisions(self) -> Decisions:
        hp = self.hparams
        labels = torch.tensor(self.setup.train_labels, device=self.conf_classes.device)
        hit = self.conf_classes == labels[:, None]
        given = (self.conf_values * hit).sum(dim=1)  # 0 when the given label is outside the top-k
        one_sided = hp["smoothing"] == "one_sided"
        smooth = smoothing(given, hp["sharpness"], hp["position"], hp["hard"], one_sided)
        kept = given >= hp["tau"]
        top_value, top_class = self.conf_values[:, 0], self.conf_classes[:, 0]
        weight = positive_weight(given, top_value, sharpness=hp["sharpness"], position=hp["position"], hard=hp["hard"],
                                 weighting=hp["weighting"], one_sided=one_sided)
        weight = torch.where(kept, weight, torch.zeros_like(weight))
        pseudo = torch.where(top_value >= hp["tau"], top_class, torch.full_like(top_class, -1))
        return Decisions(keep=kept.double().cpu().numpy(), pseudo_labels=pseudo.cpu().numpy(),
                         confidence=smooth.double().cpu().numpy(), weights=weight.double().cpu().numpy())
