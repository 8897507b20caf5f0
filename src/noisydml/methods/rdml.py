"""``rdml``: RDML's rescaled hinge on contrastive pairs (Al-Obaidi et al. 2020; BSPML Tables 1-2).

The loss, its equations and the constraints that are ours: :mod:`noisydml.methods.parts.rdml`. BSPML selects eta
from {0.5, 1, 2, 3, 4}: ``tuning.spaces.rdml`` on validation classes (the BSPML profile turns it on).
"""

from noisydml.methods.parts.pml import BASELINES, baseline_spec

SPEC = baseline_spec(BASELINES["rdml"])
