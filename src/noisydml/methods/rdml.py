"""``rdml``: RDML's rescaled hinge on contrastive pairs (Al-Obaidi et al. 2020; BSPML Tables 1-2).

The loss, its equations and the constraints that are ours: :mod:`noisydml.methods.parts.rdml`. BSPML selects eta
from {0.5, 1, 2, 3, 4}: ``tuning.spaces.rdml`` on validation classes (the BSPML profile turns it on).
"""

from noisydml.methods.parts.pml import PMLBaseline, baseline_spec
from noisydml.methods.parts.rdml import RescaledHingeContrastiveLoss
from noisydml.schema import Field

SPEC = baseline_spec(PMLBaseline(
    RescaledHingeContrastiveLoss, {"eta": 1.0, "pos_margin": 1.0, "neg_margin": 0.0},
    "RDML: contrastive pair hinges, rescaled (Al-Obaidi et al. 2020; BSPML picks eta in {0.5, 1, 2, 3, 4})",
    loss_fields={
        "eta": Field(float, 1.0, min=1e-6, help="the rescaling (BSPML selects it from {0.5, 1, 2, 3, 4}; "
                                                "1.0 untuned: ours)"),
        "pos_margin": Field(float, 1.0, help="ours: BSPML's contrastive margins, so only the rescaling differs"),
        "neg_margin": Field(float, 0.0, help="ours: BSPML's contrastive margins"),
    },
))
