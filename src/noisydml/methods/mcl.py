"""``mcl``: a pytorch-metric-learning baseline (:data:`noisydml.methods.parts.pml.MCL`)."""

from noisydml.methods.parts.pml import MCL, baseline_spec

SPEC = baseline_spec(MCL)
