"""``proxynca``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.ProxyNCALoss, {"softmax_scale": 1.0}, "ProxyNCA (Movshovitz-Attias et al. 2017)",
    needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
))
