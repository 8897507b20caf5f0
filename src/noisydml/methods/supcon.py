"""``supcon``: a pytorch-metric-learning baseline (:data:`noisydml.methods.parts.pml.SUPCON`)."""

from noisydml.methods.parts.pml import SUPCON, baseline_spec

SPEC = baseline_spec(SUPCON)
