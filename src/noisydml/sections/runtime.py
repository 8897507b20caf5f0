"""``runtime``: where and how fast a stage computes (:data:`noisydml.runtime.RUNTIME_SCHEMA`), and the rule
that ties its thread count to portable numerics."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.runtime import RUNTIME_SCHEMA
from noisydml.schema import ParamsError, SectionCheck, check_section


def _check_runtime(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    runtime = check_section(section, RUNTIME_SCHEMA, "runtime")
    if runtime["numerics"] == "portable" and runtime["threads"] == 0:
        raise ParamsError("runtime.threads: 0 (the host's core count) with runtime.numerics: portable; allowed: a "
                          "fixed count >= 1 (the thread count changes the bits), or runtime.numerics: native")
    return runtime


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "runtime": SectionCheck(_check_runtime),
}
