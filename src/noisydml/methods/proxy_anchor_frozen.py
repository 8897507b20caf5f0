"""``proxy_anchor_frozen``: Proxy-Anchor (pytorch-metric-learning) on a frozen backbone with fixed batch-norm
statistics: Smooth Proxy-Anchor's baseline on the same trainable parts (the embedding head and the proxies)."""

from noisydml.methods.base import MethodSpec
from noisydml.methods.parts.pml import PROXY_ANCHOR, PMLMethod, baseline_spec
from noisydml.methods.parts.smooth_proxy_anchor import FREEZE_FIELD, HEAD_LR_FIELD, FrozenBackbone

_BASE = baseline_spec(PROXY_ANCHOR)


class FrozenBackboneProxyAnchor(FrozenBackbone, PMLMethod):
    def __init__(self, setup):
        super().__init__(setup, PROXY_ANCHOR)


SPEC = MethodSpec(
    build=FrozenBackboneProxyAnchor,
    schema={**_BASE.schema, "freeze_backbone": FREEZE_FIELD, "head_lr_multiplier": HEAD_LR_FIELD},
    description="Proxy-Anchor (Kim et al. 2020) on a frozen backbone: Smooth Proxy-Anchor's baseline",
    nested=_BASE.nested,
)
