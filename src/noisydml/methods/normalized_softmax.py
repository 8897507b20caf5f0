"""``normalized_softmax``: a pytorch-metric-learning baseline (:class:`noisydml.methods.parts.pml.PMLBaseline`)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.NormalizedSoftmaxLoss, {"temperature": 0.05}, "normalized softmax (Zhai & Wu 2019)",
    needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
))
