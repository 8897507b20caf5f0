"""``sgps``: SGPS with the memory contrastive loss as L_clean (SGPS-MCL; Yu et al., TIP 2024).

Everything is in :mod:`noisydml.methods.parts.sgps` (PCS, feature bank, SGM, positives, PPM, L_noise) and
:mod:`noisydml.methods.parts.sgm` (Algorithms 1-4).
"""

from noisydml.methods.parts.pml import MCL
from noisydml.methods.parts.sgps import sgps_spec

SPEC = sgps_spec(MCL, "SGPS-MCL: PRISM's selection + MCL on kept samples, subgroup positives for the rest "
                        "(Yu et al. 2024)")
