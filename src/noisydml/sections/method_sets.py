"""``method_sets``: named lists of methods, for YAML anchors (``grid.methods: *default_methods``)."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import Field, SectionCheck, _check_value, check_choice


def _check_method_sets(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, list]:
    """``method_sets``: named lists of methods (params.yaml uses YAML anchors so grid.methods can point at one)."""
    out = {}
    for set_name, names in (section or {}).items():
        where = f"method_sets.{set_name}"
        _check_value(names, Field(list, item_type=str), where)
        for i, m in enumerate(names):
            check_choice(m, list(raw["methods"]), f"{where}[{i}]", "method")
        out[set_name] = list(names)
    return out


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "method_sets": SectionCheck(_check_method_sets),
}
