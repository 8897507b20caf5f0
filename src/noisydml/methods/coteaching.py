"""``coteaching``: Co-teaching (Han et al., NeurIPS 2018), cross-entropy on a linear classifier; the algorithm is in
:mod:`noisydml.methods.parts.coteaching`."""

from noisydml.methods.parts.coteaching import coteaching_spec

SPEC = coteaching_spec("Co-teaching (Han et al. 2018): two networks exchange their small-loss samples; "
                       "retrieval on the penultimate features")
