"""What DivideMix (Li et al., ICLR 2020) and UNICON (Karim et al., CVPR 2022) share: two networks, a division of
the training set into a labelled (clean) and an unlabelled (noisy) part between epochs, and MixMatch (Berthelot et
al., NeurIPS 2019) on the division.

- Augmented views (:func:`augment`): a random crop of the reflect-padded input and a horizontal flip, drawn per
  sample from a generator seeded by (run seed, step, view), so a resumed run draws the same views. They act on the
  network inputs the trainer's input pipeline made, so they work on in-memory arrays (glyphs, motifs: no
  augmentation of their own) and on file datasets (on top of the pipeline's crop) alike. Ours: the papers use
  CIFAR's crop (padding 4 of 32) and flip; ``augment.pad`` and ``augment.flip`` are parameters.
- Sharpening (MixMatch Eq. 7): ``p_c^(1/T) / Σ_c' p_c'^(1/T)``.
- MixUp as MixMatch mixes (Eqs. 8-11): λ ~ Beta(α, α), λ' = max(λ, 1 − λ), x' = λ' x₁ + (1 − λ') x₂ and the same for
  the targets. Ours: each view is mixed with a permutation of the same view's rows (MixMatch shuffles the
  concatenation of every view).
- The division's per-sample scores: the cross-entropy of the given label (DivideMix) or the Jensen-Shannon
  divergence between the prediction and the given label (UNICON), on every training row in eval mode.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from noisydml.schema import Field

AUGMENT_FIELD = Field(dict, {"pad": 4, "flip": True},
                      help="ours: the views' random crop (reflect padding in pixels) and horizontal flip (CIFAR's, "
                           "as the papers')")
AUGMENT_SCHEMA = {"pad": Field(int, 4, min=0), "flip": Field(bool, True)}

#: MixMatch's hyper-parameters as DivideMix and UNICON use them.
MIXMATCH_FIELDS: dict[str, Field] = {
    "augment": AUGMENT_FIELD,
    "sharpen_temperature": Field(float, 0.5, min=1e-3, max=1.0, help="T of the sharpening (both papers: 0.5)"),
    "mixup_alpha": Field(float, 4.0, min=1e-3, help="α of the Beta(α, α) mixing weight (DivideMix: 4 on CIFAR)"),
    "lambda_u": Field(float, 25.0, min=0.0,
                      help="weight of the unlabelled (mean squared error) term, reached after its ramp-up "
                           "(DivideMix: 0 to 150 by noise level on CIFAR; ours: 25, its 50% symmetric value)"),
    "rampup_epochs": Field(int, 2, min=0,
                           help="ours: epochs after the warm-up over which lambda_u grows linearly (the authors' "
                                "code: 16 epochs; ours: 2 of a 12-epoch budget)"),
    "warmup_epochs": Field(int, 2, min=0,
                           help="epochs of plain cross-entropy on both networks before the first division "
                                "(DivideMix: 10 of 300 on CIFAR-10; ours: 2 of 12)"),
}


def generator(*keys: int) -> torch.Generator:
    """A torch generator seeded by integers (run seed, step, view, ...)."""
    seed = int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])
    return torch.Generator().manual_seed(seed)


def augment(x: torch.Tensor, gen: torch.Generator, pad: int, flip: bool) -> torch.Tensor:
    """Per sample: a random (H, W) crop of the reflect-padded input, then a horizontal flip with probability 1/2."""
    n, _, h, w = x.shape
    if pad > 0:
        padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
        tops = torch.randint(0, 2 * pad + 1, (n,), generator=gen).tolist()
        lefts = torch.randint(0, 2 * pad + 1, (n,), generator=gen).tolist()
        x = torch.stack([padded[i, :, t:t + h, l:l + w] for i, (t, l) in enumerate(zip(tops, lefts))])
    if flip:
        flips = (torch.rand(n, generator=gen) < 0.5).to(x.device)
        x = torch.where(flips[:, None, None, None], x.flip(-1), x)
    return x


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    """MixMatch Eq. 7."""
    p = p ** (1.0 / temperature)
    return p / p.sum(dim=1, keepdim=True)


def mixing_weight(alpha: float, gen: torch.Generator) -> float:
    """λ' = max(λ, 1 − λ), λ ~ Beta(α, α) (MixMatch Eqs. 8-9): the Beta quantile (scipy's) of a uniform number
    drawn from ``gen`` (torch's Beta takes no generator, and the draw must replay on resume)."""
    from scipy.stats import beta

    u = float(torch.rand((), generator=gen, dtype=torch.float64))
    lam = float(beta.ppf(u, alpha, alpha))
    return max(lam, 1.0 - lam)


def mix(x: torch.Tensor, permutation: torch.Tensor, weight: float) -> torch.Tensor:
    """λ' x + (1 − λ') x[perm] (MixMatch Eqs. 10-11)."""
    return weight * x + (1.0 - weight) * x[permutation]


def mixmatch_losses(logits: torch.Tensor, targets: torch.Tensor, labelled: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """DivideMix Eqs. 7-9: the cross-entropy against the mixed targets on the labelled rows, the mean squared
    error between the prediction and the mixed target on the unlabelled rows, and the regularisation towards a
    uniform mean prediction, Σ_c π_c log(π_c / p̄_c) with π_c = 1/C."""
    probabilities = F.softmax(logits, dim=1)
    zero = logits.sum() * 0.0
    loss_x = -(targets[labelled] * F.log_softmax(logits[labelled], dim=1)).sum(1).mean() if labelled.any() else zero
    loss_u = ((probabilities[~labelled] - targets[~labelled]) ** 2).mean() if (~labelled).any() else zero
    prior = torch.full((logits.shape[1],), 1.0 / logits.shape[1], device=logits.device)
    mean_prediction = probabilities.mean(0)
    penalty = (prior * torch.log(prior / mean_prediction.clamp_min(1e-12))).sum()
    return loss_x, loss_u, penalty


def gmm_clean_probability(losses: np.ndarray, seed: int) -> np.ndarray:
    """DivideMix Eq. 1-2: per-sample losses min-max normalised, a two-component Gaussian mixture fitted by EM
    (scikit-learn's, with the authors' settings: 10 iterations, tolerance 1e-2, covariance regularisation 5e-4),
    and each sample's posterior of the component with the smaller mean (its clean probability w_i)."""
    from sklearn.mixture import GaussianMixture

    values = np.asarray(losses, dtype=np.float64)
    span = values.max() - values.min()
    values = (values - values.min()) / (span if span > 0 else 1.0)
    gmm = GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=seed)
    gmm.fit(values[:, None])
    clean = int(np.argmin(gmm.means_[:, 0]))
    return gmm.predict_proba(values[:, None])[:, clean]


def jensen_shannon(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Per-row Jensen-Shannon divergence (base 2, in [0, 1]) between distributions ``p`` and ``q`` (UNICON Eq. 1)."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return (a * (torch.log2(a.clamp_min(1e-12)) - torch.log2(b.clamp_min(1e-12)))).sum(1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)
