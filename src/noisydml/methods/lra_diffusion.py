"""``lra_diffusion``: LRA-Diffusion (Chen et al., NeurIPS 2023, "Label-retrieval-augmented diffusion models for
learning from noisy labels"), retrieval on the penultimate features (SGPS Sec. IV-B).

Classification as conditional generation of the label: a diffusion model over label vectors y ∈ R^C, conditioned on
the image, learns p(y | x); the noisy labels enter through *label retrieval*:

- Label retrieval (Sec. 3.2): the k nearest neighbours of every training sample in a pretrained encoder's feature
  space; in training, the target of sample i is the label of one of its neighbours drawn uniformly (each epoch
  anew), so the model learns the neighbourhood's label distribution rather than the sample's own, possibly wrong,
  label. The retrieved distribution's arg max is also a relabelling.
- Diffusion (Sec. 3.1, after DDPM and CARD): y_0 the one-hot retrieved label, y_t = √ᾱ_t y_0 + √(1 − ᾱ_t) ε, and the
  denoiser ε_θ(y_t, t, x) trained on ‖ε − ε_θ‖² at a uniform t (the DDPM objective); labels are predicted by DDIM
  sampling from y_T ~ N(0, I) (deterministic, ``sample_steps`` steps), and the arg max of y_0. ``prediction: y0``
  (ours, the default) trains the denoiser to predict y_0 instead, ‖y_0 − ŷ_θ‖²: the same objective up to a
  weighting of the steps, which learns the labels within a short budget where ε-prediction does not.
- The denoiser (CARD's conditional MLP, without its batch norms): y_t through a time-conditioned layer (a linear
  layer whose output is scaled by a learned embedding of t) and softplus, multiplied element-wise by the image's
  encoding (its L2-normalised features through a linear layer and softplus), a second time-conditioned layer, then
  a linear layer to R^C.

Ours, labelled in the schema or here: the pretrained encoder is the run's own starting backbone, frozen (the paper
uses CLIP or SimCLR weights, which cannot be fetched here); the image features the denoiser is conditioned on are
the trained backbone's (retrieval then ranks with them); the forward process has a zero prior mean (CARD centres
it on a prior classifier's prediction); the schedule (β linear from 1e-4 to 0.02 over 1,000 steps, DDPM's), k, the
widths and the denoiser's learning-rate multiplier.

Decisions judged by the trainer: ``pseudo_labels`` = the sampled labels of every training row after each epoch
(relabelling accuracy), and the retrieved labels' agreement with the given ones as ``confidence``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from noisydml.methods.base import Batch, Decisions, EpochContext, Method, MethodSetup, MethodSpec, Trainable, services_of
from noisydml.methods.parts.semisupervised import generator
from noisydml.schema import Field


class ConditionalLinear(nn.Module):
    """CARD's time-conditioned layer: ``γ_t ⊙ (W x + b)`` with γ_t a learned embedding of the step t."""

    def __init__(self, inputs: int, outputs: int, steps: int):
        super().__init__()
        self.linear = nn.Linear(inputs, outputs)
        self.embedding = nn.Embedding(steps, outputs)
        self.embedding.weight.data.uniform_()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.embedding(t) * self.linear(x)


class Denoiser(nn.Module):
    """ε_θ(y_t, t, features), CARD's conditional MLP: y_t through a time-conditioned layer, multiplied element-wise
    by the image's encoding (the L2-normalised features through a linear layer and softplus), a second
    time-conditioned layer, then a linear layer to R^C."""

    def __init__(self, num_classes: int, feature_dim: int, hidden: int, steps: int):
        super().__init__()
        self.condition = nn.Linear(feature_dim, hidden)
        self.layer1 = ConditionalLinear(num_classes, hidden, steps)
        self.layer2 = ConditionalLinear(hidden, hidden, steps)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, y: torch.Tensor, t: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        image = F.softplus(self.condition(F.normalize(features, dim=1)))
        h = image * F.softplus(self.layer1(y, t))
        h = F.softplus(self.layer2(h, t))
        return self.out(h)


def noise_schedule(steps: int, beta_start: float = 1e-4, beta_end: float = 0.02) -> torch.Tensor:
    """ᾱ_t = Π_{s ≤ t} (1 − β_s), β linear (DDPM)."""
    betas = torch.linspace(beta_start, beta_end, steps, dtype=torch.float64)
    return torch.cumprod(1.0 - betas, dim=0).float()


@torch.no_grad()
def ddim_sample(denoiser: Denoiser, features: torch.Tensor, alpha_bar: torch.Tensor, sample_steps: int,
                gen: torch.Generator, prediction: str = "epsilon") -> torch.Tensor:
    """Deterministic DDIM (η = 0) from y_T ~ N(0, I) to ŷ_0 over ``sample_steps`` evenly spaced steps; the denoiser
    predicts ε (``prediction: epsilon``) or y_0 (``y0``), the other following from y_t = √ᾱ y_0 + √(1 − ᾱ) ε."""
    steps = len(alpha_bar)
    times = torch.linspace(steps - 1, 0, sample_steps).round().long().tolist()
    y = torch.randn(len(features), denoiser.out.out_features, generator=gen).to(features.device)
    for i, t in enumerate(times):
        a = alpha_bar[t].to(features.device)
        out = denoiser(y, torch.full((len(y),), t, dtype=torch.long, device=y.device), features)
        if prediction == "y0":
            y0, eps = out, (y - a.sqrt() * out) / (1 - a).sqrt()
        else:
            y0, eps = (y - (1 - a).sqrt() * out) / a.sqrt(), out
        if i + 1 == len(times):
            return y0
        a_next = alpha_bar[times[i + 1]].to(features.device)
        y = a_next.sqrt() * y0 + (1 - a_next).sqrt() * eps
    return y


class LRADiffusion(Method):
    retrieval = "features"

    def __init__(self, setup: MethodSetup):
        super().__init__(setup)
        services = services_of(setup, "lra_diffusion (its label retrieval encodes with the run's starting network)")
        hp = self.hparams
        self.denoiser = Denoiser(setup.num_classes, setup.feature_dim, hp["hidden"], hp["diffusion_steps"])
        # the pretrained encoder of the label retrieval: the run's starting backbone, frozen (not trained, not in
        # the optimizer); a plain attribute, so it is neither checkpointed nor moved with the method's state
        self._encoder = [services.build_network().eval().requires_grad_(False)]
        self.register_buffer("alpha_bar", noise_schedule(hp["diffusion_steps"]))
        # until the retrieval has run (on_train_start), every row's own label
        own = torch.as_tensor(np.asarray(setup.train_labels), dtype=torch.long)
        self.register_buffer("neighbour_labels", own[:, None].repeat(1, hp["neighbours"]))
        self.register_buffer("sampled", torch.full((setup.dataset_size,), -1, dtype=torch.long))

    def lr_multiplier(self) -> float:
        return float(self.hparams["lr_multiplier"])

    def trainable(self, epoch: int) -> Trainable:
        return Trainable(frozen=("head",))

    def on_train_start(self, ctx: EpochContext, restored: bool) -> None:
        if restored:
            return  # the neighbours are in the checkpoint
        _, features = self.setup.services.embed_train(self._encoder[0])
        features = F.normalize(features, dim=1).numpy().astype(np.float32)
        _, neighbours = ctx.knn(features, self.hparams["neighbours"])  # each row's own excluded
        self.neighbour_labels.copy_(torch.as_tensor(ctx.train_labels)[torch.as_tensor(neighbours)])

    def retrieved_labels(self, batch: Batch) -> torch.Tensor:
        """One neighbour's label per row, drawn uniformly (seeded by the run's seed and the step)."""
        k = self.neighbour_labels.shape[1]
        pick = torch.randint(0, k, (len(batch.index),), generator=generator(self.setup.seed, batch.step, 7))
        return self.neighbour_labels[batch.index, pick.to(batch.index.device)]

    def loss(self, batch: Batch):
        y0 = F.one_hot(self.retrieved_labels(batch), self.setup.num_classes).float()
        gen = generator(self.setup.seed, batch.step, 8)
        t = torch.randint(0, len(self.alpha_bar), (len(y0),), generator=gen).to(y0.device)
        eps = torch.randn(y0.shape, generator=gen).to(y0.device)
        a = self.alpha_bar[t][:, None]
        yt = a.sqrt() * y0 + (1 - a).sqrt() * eps
        target = y0 if self.hparams["prediction"] == "y0" else eps
        return ((self.denoiser(yt, t, batch.features) - target) ** 2).sum(1).mean(), {}

    def on_epoch_end(self, ctx: EpochContext) -> dict[str, float]:
        _, features = ctx.embed_train(features=True)
        gen = generator(self.setup.seed, ctx.step, 9)
        device = self.alpha_bar.device
        y0 = torch.cat([ddim_sample(self.denoiser, part.to(device), self.alpha_bar, self.hparams["sample_steps"], gen,
                                    self.hparams["prediction"]) for part in features.split(4096)])
        self.sampled.copy_(y0.argmax(1))
        given = torch.as_tensor(ctx.train_labels).to(device)
        return {"lra_agrees_with_given": float((self.sampled == given).float().mean())}

    def decisions(self) -> Decisions | None:
        if bool((self.sampled < 0).any()):
            return None
        given = torch.tensor(self.setup.train_labels)[:, None]
        agreement = (self.neighbour_labels.cpu() == given).float().mean(1).numpy()
        return Decisions(pseudo_labels=self.sampled.cpu().numpy(), confidence=agreement)


SPEC = MethodSpec(
    build=LRADiffusion,
    schema={
        "neighbours": Field(int, 10, min=1, help="ours: k of the label retrieval (the paper's k is dataset-tuned)"),
        "diffusion_steps": Field(int, 1000, min=2, help="T of the forward process (DDPM's 1,000)"),
        "sample_steps": Field(int, 10, min=1, help="ours: DDIM steps of a prediction"),
        "hidden": Field(int, 256, min=8, help="ours: the denoiser's width"),
        "prediction": Field(str, "y0", choices=("y0", "epsilon"),
                            help="what the denoiser predicts: epsilon (DDPM's and the paper's) or y0 (ours: the same "
                                 "objective up to a weighting of the steps; measured here, epsilon over 200 classes "
                                 "samples chance-level labels within a 12-epoch budget, y0 learns them)"),
        "lr_multiplier": Field(float, 10.0, min=0.0, help="ours: the denoiser's learning rate / train's"),
    },
    description="LRA-Diffusion (Chen et al. 2023): a label diffusion model trained on retrieved neighbours' labels",
)
