"""Two networks, a division of the training set between epochs, MixMatch on it: the training step DivideMix (Li et
al., ICLR 2020, Algorithm 1) and UNICON (Karim et al., CVPR 2022, Algorithm 1) share. How the set is divided is
each method's own (:meth:`CoDivideMethod.divide`): DivideMix's GMM over per-sample losses, UNICON's uniform
selection by Jensen-Shannon divergence.

One training step, after ``warmup_epochs`` of plain cross-entropy on both networks (Algorithm 1, line 3):

- every row of the P x K batch is labelled or unlabelled by the division the *other* network made (co-divide),
  with its clean probability w_i;
- two augmented views of the batch; without gradient, each network's predictions on both (line 11-12);
- co-refinement of a labelled row's target, ȳ = sharpen(w y + (1 − w) p̄_own) (lines 13-14), co-guessing of an
  unlabelled row's, q = sharpen(mean of both networks' predictions on both views) (lines 15-16);
- MixMatch on both views, then the loss of each network: cross-entropy on the mixed labelled rows, λ_u times the
  mean squared error on the mixed unlabelled rows (λ_u ramped up linearly after the warm-up), and the uniform-
  prior regularisation (Eqs. 7-10); the two networks' losses are summed (disjoint parameters: one backward).

Ours, labelled in the schema or here: both networks train in the same step, on the same views and mixing (the
papers alternate epochs: net 1, then net 2); the labelled and unlabelled rows are those of one P x K batch (the
papers draw a labelled and an unlabelled batch); the views are :func:`~noisydml.methods.parts.semisupervised.augment`
on the pipeline's inputs; every pass is in training mode (the authors guess with the other network in eval mode);
the reported network is the trainer's (net 1), retrieval on its features. The step forwards net 1 several times,
so these methods run on one process (the trainer refuses ``runtime.processes`` > 1 with the reason).

Decisions judged by the trainer: ``keep`` = labelled for net 1 this epoch, ``confidence`` = its w,
``pseudo_labels`` = the arg max of the last target each row trained with (refined or guessed).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from noisydml.methods.base import Batch, Decisions, EpochContext, MethodSetup, Trainable, services_of
from noisydml.methods.parts.classification import ClassificationMethod, PeerNetwork
from noisydml.methods.parts.semisupervised import augment, generator, mix, mixing_weight, mixmatch_losses, sharpen


class CoDivideMethod(ClassificationMethod):
    #: UNICON trains the embedding heads as its contrastive projection
    trains_head = False

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        self.peer = PeerNetwork(setup, self.new_classifier(), train_head=self.trains_head)
        n = setup.dataset_size
        # the division each network trains on (made from the other network's, or both networks', predictions)
        self.register_buffer("labelled_main", torch.ones(n, dtype=torch.bool))
        self.register_buffer("weight_main", torch.ones(n))
        self.register_buffer("labelled_peer", torch.ones(n, dtype=torch.bool))
        self.register_buffer("weight_peer", torch.ones(n))
        self.register_buffer("divided", torch.zeros((), dtype=torch.bool))
        self.register_buffer("target_label", torch.full((n,), -1, dtype=torch.long))

    def trainable(self, epoch: int) -> Trainable:
        return Trainable() if self.trains_head else Trainable(frozen=("head",))

    # ------------------------------------------------------------------ the division (between epochs)

    def divide(self, ctx: EpochContext, main: torch.Tensor, peer: torch.Tensor) -> dict[str, torch.Tensor]:
        """From both networks' softmax outputs on every training row (eval mode): ``labelled_main``,
        ``weight_main`` (the division net 1 trains on) and ``labelled_peer``, ``weight_peer``, plus numbers to log."""
        raise NotImplementedError

    def on_epoch_start(self, ctx: EpochContext) -> dict[str, float]:
        self.target_label.fill_(-1)
        if ctx.epoch < self.hparams["warmup_epochs"]:
            return {}
        _, features = ctx.embed_train(features=True)
        _, peer_features = services_of(self.setup, type(self).__name__).embed_train(self.peer.network)
        main = self.predictions(features)
        peer = self.predictions(peer_features, self.peer.classifier)
        division = self.divide(ctx, main, peer)
        logs = {}
        for key, value in division.items():
            if key in ("labelled_main", "weight_main", "labelled_peer", "weight_peer"):
                getattr(self, key).copy_(value.to(getattr(self, key).device))
            else:
                logs[key] = float(value)
        self.divided.fill_(True)
        logs["codivide_labelled_main"] = float(self.labelled_main.float().mean())
        return logs

    # ------------------------------------------------------------------ the step

    def unlabelled_weight(self, epoch: int) -> float:
        """λ_u, linear from 0 after the warm-up to ``lambda_u`` over ``rampup_epochs`` (the authors' linear_rampup,
        by whole epochs here)."""
        ramp = self.hparams["rampup_epochs"]
        done = epoch - self.hparams["warmup_epochs"]
        return self.hparams["lambda_u"] * (1.0 if ramp == 0 else float(np.clip(done / ramp, 0.0, 1.0)))

    def loss(self, batch: Batch):
        services_of(self.setup, type(self).__name__)
        if batch.epoch < self.hparams["warmup_epochs"] or not bool(self.divided):
            return self.warmup_loss(batch)
        return self.mixmatch_loss(batch)

    def warmup_loss(self, batch: Batch):
        _, peer_features = self.setup.services.forward(batch, self.peer.network)
        main, _ = super().loss(batch)
        return main + F.cross_entropy(self.peer.classifier(peer_features), batch.labels), {}

    def view(self, batch: Batch, number: int):
        """The transform of augmented view ``number`` of this batch (the same draw at every call of the step)."""
        seed, pad, flip = self.setup.seed, self.hparams["augment"]["pad"], self.hparams["augment"]["flip"]

        def transform(x: torch.Tensor, rows: slice) -> torch.Tensor:
            return augment(x, generator(seed, batch.step, number, rows.start), pad, flip)

        return transform

    def mixed_view(self, batch: Batch, number: int, permutation: torch.Tensor, weight: float):
        view = self.view(batch, number)

        def transform(x: torch.Tensor, rows: slice) -> torch.Tensor:
            local = (permutation[rows] - rows.start).to(x.device)
            return mix(view(x, rows), local, weight)

        return transform

    def mixmatch_loss(self, batch: Batch):
        networks = {"main": (None, self.classifier), "peer": (self.peer.network, self.peer.classifier)}
        labels = F.one_hot(batch.labels, self.setup.num_classes).float()
        temperature = self.hparams["sharpen_temperature"]
        with torch.no_grad():
            predictions = {name: [F.softmax(classifier(self.setup.services.forward(batch, net, self.view(batch, v))[1]), dim=1)
                                  for v in (1, 2)] for name, (net, classifier) in networks.items()}
            guessed = sharpen(sum(p for ps in predictions.values() for p in ps) / 4.0, temperature)  # co-guessing
        n, gen = len(batch.labels), generator(self.setup.seed, batch.step, 0)
        mixes = [(torch.randperm(n, generator=gen), mixing_weight(self.hparams["mixup_alpha"], gen)) for _ in (1, 2)]
        lambda_u = self.unlabelled_weight(batch.epoch)
        total, logs = 0.0, {}
        for name, (net, classifier) in networks.items():
            labelled = getattr(self, f"labelled_{name}")[batch.index]
            w = getattr(self, f"weight_{name}")[batch.index][:, None]
            own = (predictions[name][0] + predictions[name][1]) / 2.0
            refined = sharpen(w * labels + (1.0 - w) * own, temperature)  # co-refinement
            targets = torch.where(labelled[:, None], refined, guessed)
            if name == "main":
                self.target_label[batch.index] = targets.argmax(1)
            logits, mixed_targets, mixed_labelled = [], [], []
            for v, (permutation, weight) in zip((1, 2), mixes):
                _, features = self.setup.services.forward(batch, net, self.mixed_view(batch, v, permutation, weight))
                logits.append(classifier(features))
                mixed_targets.append(mix(targets, permutation.to(targets.device), weight))
                mixed_labelled.append(labelled)
            loss_x, loss_u, penalty = mixmatch_losses(torch.cat(logits), torch.cat(mixed_targets),
                                                      torch.cat(mixed_labelled))
            total = total + loss_x + lambda_u * loss_u + penalty
            logs.update({f"{name}_loss_x": loss_x.item(), f"{name}_loss_u": loss_u.item()})
        extra, extra_logs = self.extra_loss(batch)
        return total + extra, {**logs, **extra_logs, "lambda_u": lambda_u}

    def extra_loss(self, batch: Batch):
        """A method's own term beside MixMatch (UNICON's contrastive loss); none by default."""
        return 0.0, {}

    def decisions(self) -> Decisions:
        labels = self.target_label.cpu().numpy()
        return Decisions(keep=self.labelled_main.cpu().numpy().astype(float),
                         confidence=self.weight_main.cpu().numpy(),
                         pseudo_labels=labels if (labels >= 0).any() else None) if bool(self.divided) else None
