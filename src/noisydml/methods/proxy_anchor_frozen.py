"""``proxy_anchor_frozen``: Proxy-Anchor (pytorch-metric-learning) on a frozen backbone with fixed batch-norm
statistics: Smooth Proxy-Anchor's baseline on the same trainable parts (the embedding head and the proxies)."""

from noisydml.methods.base import MethodSpec, Trainable
from noisydml.methods.parts.pml import BASELINES, PMLMethod, baseline_spec
from noisydml.methods.parts.smooth_proxy_anchor import FREEZE_FIELD, HEAD_LR_FIELD, frozen_backbone

_BASE = baseline_spec(BASELINES["proxy_anchor"])


class FrozenBackboneProxyAnchor(PMLMethod):
    def __init__(self, setup):
        super().__init__(setup, BASELINES["proxy_anchor"])

    def trainable(self, epoch: int) -> Trainable:
        return frozen_backbone(self.hparams["freeze_backbone"])

    def head_lr_factor(self) -> float:
        return float(self.hparams["head_lr_multiplier"])


SPEC = MethodSpec(
    build=FrozenBackboneProxyAnchor,
    schema={**_BASE.schema, "freeze_backbone": FREEZE_FIELD, "head_lr_multiplier": HEAD_LR_FIELD},
    description="Proxy-Anchor (Kim et al. 2020) on a frozen backbone: Smooth Proxy-Anchor's baseline",
    nested=_BASE.nested,
)
