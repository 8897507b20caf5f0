"""``spa_smooth_loss``: Smooth Proxy-Anchor's phase 2 (Roig et al. 2020), trained as the chained run
``smooth_proxy_anchor`` from an ``spa_confidence`` run.

Everything is in :mod:`noisydml.methods.parts.smooth_proxy_anchor` (what the paper states, what is
reconstructed, and from what).
"""

from noisydml.methods.base import MethodSpec
from noisydml.methods.parts.smooth_proxy_anchor import LOSS_SCHEMA, SMOOTH_PA_SCHEMA, SmoothProxyAnchor

SPEC = MethodSpec(
    build=SmoothProxyAnchor,
    schema=SMOOTH_PA_SCHEMA,
    description="Smooth Proxy-Anchor phase 2: Proxy-Anchor with proxies selected by, and terms smoothly weighted "
                "by, phase 1's class confidences, on the (frozen) backbone (Roig et al. 2020; reconstructed)",
    nested={"loss": LOSS_SCHEMA},
)
