"""``contrastive``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec, cosine

SPEC = baseline_spec(PMLBaseline(
    losses.ContrastiveLoss, {"pos_margin": 1.0, "neg_margin": 0.0},
    "contrastive loss on cosine similarities (BSPML's setting: pos margin 1, neg margin 0)", fixed=cosine,
    reducible=True,
))
