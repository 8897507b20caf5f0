"""``proxy_anchor``: a pytorch-metric-learning baseline (:data:`noisydml.methods.parts.pml.PROXY_ANCHOR`)."""

from noisydml.methods.parts.pml import PROXY_ANCHOR, baseline_spec

SPEC = baseline_spec(PROXY_ANCHOR)
