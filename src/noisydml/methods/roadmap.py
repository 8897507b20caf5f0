"""``roadmap``: ROADMAP, SupAP + calibration loss (Ramzi et al., NeurIPS 2021; SGPS Tables I-III).

The loss and its equations: :mod:`noisydml.methods.parts.roadmap`.
"""

from noisydml.methods.parts.pml import baseline_spec
from noisydml.methods.parts.roadmap import ROADMAP

SPEC = baseline_spec(ROADMAP)
