"""``dcq``: the dynamic class queue (Li et al., CVPR 2021), SGPS Table IV's classifier-free face baseline.

Everything is in :mod:`noisydml.methods.parts.dcq` (the queue, the momentum key encoder, Eq. 18)."""

from noisydml.methods.parts.dcq import dcq_spec

SPEC = dcq_spec()
