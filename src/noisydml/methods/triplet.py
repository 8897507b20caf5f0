"""``triplet``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.TripletMarginLoss, {"margin": 0.1, "smooth_loss": True},
    "smooth triplet loss over all triplets of the batch",
))
