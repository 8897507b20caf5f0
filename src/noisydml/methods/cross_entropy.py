"""``cross_entropy``: plain cross-entropy on a linear classifier over the backbone features, retrieval on the
L2-normalised features (SGPS Sec. IV-B): the classification baselines' common base (Co-teaching with a forget rate
of 0 trains each of its networks this way). See :mod:`noisydml.methods.parts.classification`."""

import torch.nn.functional as F

from noisydml.methods.base import Batch, MethodSpec
from noisydml.methods.parts.classification import CLASSIFIER_FIELDS, ClassificationMethod


class CrossEntropy(ClassificationMethod):
    def loss(self, batch: Batch):
        return F.cross_entropy(self.classifier(batch.features), batch.labels), {}


SPEC = MethodSpec(build=CrossEntropy, schema=dict(CLASSIFIER_FIELDS),
                  description="cross-entropy on a classifier over the penultimate features (retrieval on them)")
