"""``prism``: PRISM + memory contrastive loss (Liu et al., CVPR 2021); with ``noise_rate: 0`` it is ``mcl``.

The selector (Eqs. 2-7, Algorithm 1) is in :mod:`noisydml.methods.parts.prism`.
"""

from noisydml.methods.parts.pml import MCL
from noisydml.methods.parts.prism import prism_spec

SPEC = prism_spec(MCL, "PRISM + memory contrastive loss (Liu et al. 2021); with noise_rate 0 it is mcl")
