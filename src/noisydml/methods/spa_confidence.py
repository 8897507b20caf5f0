"""``spa_confidence``: Smooth Proxy-Anchor's phase 1, the confidence module (Roig et al. 2020).

Everything is in :mod:`noisydml.methods.parts.smooth_proxy_anchor`; phase 2 is the chained run
``smooth_proxy_anchor`` that takes this run's exported confidences.
"""

from noisydml.methods.base import MethodSpec
from noisydml.methods.parts.smooth_proxy_anchor import CONFIDENCE_SCHEMA, ConfidenceModule

SPEC = MethodSpec(
    build=ConfidenceModule,
    schema=CONFIDENCE_SCHEMA,
    exports=("confidence_classes", "confidence_values", "confidence_label"),
    description="Smooth Proxy-Anchor phase 1: a confidence module on the (frozen) backbone's features, trained on "
                "the noisy labels; exports per-sample top-k class confidences (Roig et al. 2020)",
)
