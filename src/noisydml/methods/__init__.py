"""The method registry: names in params.yaml -> how to build the method.

To add a method, subclass :class:`noisydml.methods.base.Method`, give it a
``schema`` of hyper-parameters, and add a :class:`MethodSpec` here. The
trainer, stages and dvc.yaml need no change.
"""

from noisydml.methods.base import EpochContext, Method, MethodSetup, MethodSpec
from noisydml.methods.baselines import BASELINES, baseline_spec
from noisydml.methods.prism import PRISM_METHODS

METHODS: dict[str, MethodSpec] = {name: baseline_spec(b) for name, b in BASELINES.items()}
METHODS.update(PRISM_METHODS)


def build_method(name: str, setup: MethodSetup) -> Method:
    return METHODS[name].build(setup)


__all__ = ["METHODS", "build_method", "EpochContext", "Method", "MethodSetup", "MethodSpec"]
