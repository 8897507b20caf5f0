"""``spms``: BSPML's ablation without the balance regularization term (mu = 0; Zhang et al. 2023).

The algorithm is :mod:`noisydml.methods.parts.bspml`'s, with Eq. 6's last term removed.
"""

from noisydml.methods.parts.bspml import bspml_spec

SPEC = bspml_spec(balance=False)
