"""``sgps_roadmap``: SGPS with ROADMAP as L_clean (SGPS-Roadmap; Yu et al., TIP 2024, Tables I-III).

ROADMAP has no memory of its own; PCS's memory (Eq. 1) and L_noise's memory term (Eq. 15) are SGPS's. ROADMAP's
SupAP is computed over the kept rows of the batch (:mod:`noisydml.methods.parts.roadmap`).
"""

from noisydml.methods.parts.roadmap import ROADMAP
from noisydml.methods.parts.sgps import sgps_spec

SPEC = sgps_spec(ROADMAP, "SGPS-Roadmap: PRISM's selection + ROADMAP on kept samples, subgroup positives for "
                            "the rest (Yu et al. 2024)")
