"""``methods``: hyper-parameters per method name (each entry validated by its method where it is trained)."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import ParamsError, SectionCheck, check_name


def _check_methods(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    """``methods``: hyper-parameters per method name. Each entry is validated by its method's schema where a stage
    trains it (:func:`noisydml.methods.check_method`); that every name is a module of the method catalog is
    :mod:`noisydml.tools.check`'s rule (and a stage refuses an unknown method it is asked to train)."""
    if not isinstance(section, Mapping):
        raise ParamsError("methods: expected a mapping of method name -> hyper-parameters")
    return {check_name(name, "methods"): dict(body or {}) for name, body in section.items()}


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "methods": SectionCheck(_check_methods),
}
