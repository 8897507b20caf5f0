"""torch.optim's optimizers, without importing ``torch._dynamo`` (1.5 s of every training process's start).

Every built-in optimizer guards itself against ``torch.compile``: ``step`` is wrapped so that it runs under
``torch.no_grad`` with a ``torch._dynamo.graph_break()`` on each side, and ``zero_grad``, ``state_dict``,
``load_state_dict`` and ``add_param_group`` are wrapped in ``torch._disable_dynamo``, which imports
``torch._dynamo`` on its first call to learn "do not compile this". Outside ``torch.compile`` both are no-ops
beyond ``no_grad``, and noisydml compiles nothing; yet the import happened in every process on its first step
(``python -X importtime``, docs/launch.md).

:func:`eager` returns the optimizer class whose ``step`` is the built-in's own step under ``torch.no_grad`` (what
the wrapper does when nothing is compiled: ``differentiable=False``, which we never change); the four other
methods keep torch's wrapper, whose per-function cache is filled with the function itself while ``torch._dynamo``
is not loaded (when it is, e.g. a user's ``torch.compile`` in the same process, torch's own path is left as it
is). The numbers are the built-in's: the same functions run, in the same order (tests/test_eager_optim.py
compares them bit for bit, and checks that a step leaves ``torch._dynamo`` unloaded).
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch
from torch._compile import _disable_dynamo

#: The code of the wrapper torch._disable_dynamo puts around a function: how its instances are recognised.
_DISABLE_DYNAMO_WRAPPER = _disable_dynamo(lambda: None).__code__


def _settle(method) -> None:
    """Fill the cache of ``method``'s ``torch._disable_dynamo`` wrapper (if it is one) with the wrapped function:
    the wrapper then calls it without importing ``torch._dynamo`` to build a "disabled" version of it."""
    code = getattr(method, "__code__", None)
    if code is _DISABLE_DYNAMO_WRAPPER:
        function = method.__closure__[code.co_freevars.index("fn")].cell_contents
        if getattr(function, "__dynamo_disable", None) is None:
            setattr(function, "__dynamo_disable", function)


@functools.cache
def eager(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``cls`` (a torch.optim optimizer) as a subclass whose methods do not import ``torch._dynamo``."""
    if "torch._dynamo" not in sys.modules:
        # zero_grad, state_dict, load_state_dict, add_param_group (the functional forms' wrappers, inside
        # _disable_dynamo_if_unsupported, run only under torch.compile)
        for method in vars(torch.optim.Optimizer).values():
            _settle(method)
    builtin_step = inspect.unwrap(cls.step)

    def step(self, closure=None):
        if self.defaults.get("differentiable"):
            return cls.step(self, closure)
        with torch.no_grad():
            return builtin_step(self, closure)

    return type(cls.__name__, (cls,), {"step": step, "__doc__": f"torch.optim.{cls.__name__}, eager ({__name__})",
                                       "__module__": __name__})
