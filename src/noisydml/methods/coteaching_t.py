"""``coteaching_t``: "Co-teaching w/ T" (PRISM Tables 1-3, "Co-teaching [11] w/ Temperature [53]"; SGPS's
"Co-teaching w/ T"): Co-teaching on the normalised softmax with temperature (Zhai & Wu 2019) instead of a linear
classifier; the algorithm is in :mod:`noisydml.methods.parts.coteaching`."""

from noisydml.methods.parts.coteaching import coteaching_spec

SPEC = coteaching_spec("Co-teaching on the normalised softmax with temperature (PRISM's 'Co-teaching w/ Temperature')",
                       classifier="normalized")
