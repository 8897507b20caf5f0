"""``contextual``: the contextual-similarity loss (Liao et al., ICML 2023; SGPS Tables I-III).

The loss and its equations: :mod:`noisydml.methods.parts.contextual`.
"""

from noisydml.methods.parts.pml import BASELINES, baseline_spec

SPEC = baseline_spec(BASELINES["contextual"])
