"""``arcface``: additive angular margin softmax (Deng et al., CVPR 2019), pytorch-metric-learning's ``ArcFaceLoss``.

A classifier (one weight vector per training identity) on the L2-normalised embeddings: logits ``s cos(theta_j)``,
the target's ``s cos(theta_y + m)``. pml's margin is in degrees: 28.6 = 0.5 rad, ArcFace's (and arcface_torch's
``margin_list (1, 0.5, 0)``); SGPS's Table IV ran "scale 64, margin 0.4" (its profile sets 22.92 degrees)."""

from pytorch_metric_learning import losses

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec

SPEC = baseline_spec(PMLBaseline(
    losses.ArcFaceLoss, {"margin": 28.6, "scale": 64.0}, "ArcFace: additive angular margin softmax (Deng et al. 2019)",
    needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
))
