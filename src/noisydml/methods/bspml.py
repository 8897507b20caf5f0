"""``bspml``: balanced self-paced metric learning (Zhang, Luo, Gu, AAAI 2023).

The algorithm (Eqs. 3, 6-8, Algs. 1-3) is in :mod:`noisydml.methods.parts.bspml`.
"""

from noisydml.methods.parts.bspml import bspml_spec

SPEC = bspml_spec(balance=True)
