"""``ms``: a pytorch-metric-learning baseline (:data:`noisydml.methods.parts.pml.MS`)."""

from noisydml.methods.parts.pml import MS, baseline_spec

SPEC = baseline_spec(MS)
