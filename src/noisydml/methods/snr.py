"""``snr``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.SignalToNoiseRatioContrastiveLoss, {"pos_margin": 0.0, "neg_margin": 1.0},
    "signal-to-noise-ratio contrastive loss (Yuan et al. 2019)",
))
