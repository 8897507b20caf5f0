"""``contextual``: the contextual-similarity loss (Liao et al., ICML 2023; SGPS Tables I-III).

The loss and its equations: :mod:`noisydml.methods.parts.contextual`.
"""

from noisydml.methods.parts.pml import baseline_spec
from noisydml.methods.parts.contextual import CONTEXTUAL

SPEC = baseline_spec(CONTEXTUAL)
