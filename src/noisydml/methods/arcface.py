"""``arcface``: additive angular margin softmax (Deng et al., CVPR 2019), pytorch-metric-learning's ``ArcFaceLoss``.

A classifier (one weight vector per training identity) on the L2-normalised embeddings: logits ``s cos(theta_j)``,
the target's ``s cos(theta_y + m)`` (Eq. 3). pml's margin is in degrees: 28.6479 = 0.5 rad exactly, ArcFace's
(Sec. 3) and arcface_torch's ``margin_list (1, 0.5, 0)``; SGPS's Table IV states "scale 64, margin 0.4" for its
classifiers (its profile sets 0.4 rad = 22.918 degrees, labelled there).

``loss.formulation`` (ours to offer, both the codes'): ``pml`` differentiates through the angle and keeps the logit
monotonic past ``theta_y = pi - m`` (pml's, as ArcFace's paper); ``arcface_torch`` is insightface's current
arcface_torch: the same value without the threshold, the gradient that of ``s cos theta_y`` (straight through;
:mod:`noisydml.methods.parts.margin_softmax`)."""

from noisydml.methods.parts.margin_softmax import ARCFACE_FORMULATIONS, ARCFACE_MARGIN_DEGREES, arcface_loss
from noisydml.methods.parts.pml import PMLBaseline, baseline_spec
from noisydml.schema import Field

SPEC = baseline_spec(PMLBaseline(
    arcface_loss, {"margin": ARCFACE_MARGIN_DEGREES, "scale": 64.0, "formulation": "pml"},
    "ArcFace: additive angular margin softmax (Deng et al. 2019)",
    needs=("num_classes", "embedding_size"), lr_multiplier=100.0,
    loss_fields={"margin": Field(float, ARCFACE_MARGIN_DEGREES, min=0.0,
                                 help="m in degrees (28.64788975654116 = 0.5 rad: ArcFace's, arcface_torch's)"),
                 "formulation": Field(str, "pml", choices=ARCFACE_FORMULATIONS,
                                      help="pml: gradient through the angle, monotonic past pi - m | arcface_torch: "
                                           "straight-through gradient, no threshold (insightface's current code)")},
))
