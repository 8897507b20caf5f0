"""``cross_entropy``: plain cross-entropy on a linear classifier over the backbone features, retrieval on the
L2-normalised features (SGPS Sec. IV-B): the classification baselines' common base (Co-teaching with a forget rate
of 0 trains each of its networks this way). The loss is :class:`~noisydml.methods.parts.classification.
ClassificationMethod`'s own."""

from noisydml.methods.base import MethodSpec
from noisydml.methods.parts.classification import CLASSIFIER_FIELDS, ClassificationMethod

SPEC = MethodSpec(build=ClassificationMethod, schema=dict(CLASSIFIER_FIELDS),
                  description="cross-entropy on a classifier over the penultimate features (retrieval on them)")
