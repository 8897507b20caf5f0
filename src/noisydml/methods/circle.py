"""``circle``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(losses.CircleLoss, {"m": 0.4, "gamma": 80.0}, "Circle loss (Sun et al. 2020)"))
