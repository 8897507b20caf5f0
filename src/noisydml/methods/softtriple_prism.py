"""``softtriple_prism``: PRISM's selection in front of SoftTriple (PRISM, Table 3).

The selector (Eqs. 2-7, Algorithm 1) is in :mod:`noisydml.methods.parts.prism`.
"""

from noisydml.methods.parts.pml import SOFTTRIPLE
from noisydml.methods.parts.prism import prism_spec

SPEC = prism_spec(SOFTTRIPLE, "PRISM's selection in front of SoftTriple (PRISM Table 3)")
