"""``cosface``: large margin cosine loss (Wang et al., CVPR 2018), pytorch-metric-learning's ``CosFaceLoss``.

A classifier on the L2-normalised embeddings: logits ``s cos(theta_j)``, the target's ``s (cos(theta_y) - m)``;
CosFace's m 0.35 (arcface_torch's configs: 0.4, SGPS's Table IV: scale 64, margin 0.4)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.CosFaceLoss, {"margin": 0.35, "scale": 64.0}, "CosFace: large margin cosine loss (Wang et al. 2018)",
    needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
))
