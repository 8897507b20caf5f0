"""``softtriple``: a pytorch-metric-learning baseline (:data:`noisydml.methods.parts.pml.SOFTTRIPLE`)."""

from noisydml.methods.parts.pml import SOFTTRIPLE, baseline_spec

SPEC = baseline_spec(SOFTTRIPLE)
