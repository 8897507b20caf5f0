"""``fastap``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(losses.FastAPLoss, {"num_bins": 10}, "FastAP (Cakir et al. 2019)"))
