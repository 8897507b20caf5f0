"""``sgps_supcon``: SGPS with SupCon as L_clean (SGPS-SupCon; Yu et al., TIP 2024, Tables I-III).

SupCon has no memory of its own; PCS's memory (Eq. 1) and L_noise's memory term (Eq. 15) are SGPS's.
"""

from noisydml.methods.parts.pml import SUPCON
from noisydml.methods.parts.sgps import sgps_spec

SPEC = sgps_spec(SUPCON, "SGPS-SupCon: PRISM's selection + SupCon on kept samples, subgroup positives for "
                           "the rest (Yu et al. 2024)")
