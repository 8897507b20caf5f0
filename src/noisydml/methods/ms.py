"""``ms``: a pytorch-metric-learning baseline (see :data:`noisydml.methods.parts.pml.BASELINES`)."""

from noisydml.methods.parts.pml import BASELINES, baseline_spec

SPEC = baseline_spec(BASELINES["ms"])
