"""``sgps_contextual``: SGPS with the contextual loss as L_clean (SGPS-Contextual; Yu et al., TIP 2024, Tables I-III).

The contextual loss has no memory of its own; PCS's memory (Eq. 1) and L_noise's memory term (Eq. 15) are SGPS's.
Its neighbourhoods are taken among the kept rows of the batch (:mod:`noisydml.methods.parts.contextual`).
"""

from noisydml.methods.parts.contextual import CONTEXTUAL
from noisydml.methods.parts.sgps import sgps_spec

SPEC = sgps_spec(CONTEXTUAL, "SGPS-Contextual: PRISM's selection + the contextual loss on kept samples, "
                               "subgroup positives for the rest (Yu et al. 2024)")
