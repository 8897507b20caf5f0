"""``noise``: noise setting name -> its kind and settings (each body validated by its kind where it is used)."""

from __future__ import annotations

from noisydml.schema import SectionCheck, check_named_sections




#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "noise": SectionCheck(lambda s, p, raw: check_named_sections(s, "noise", "noise")),
}
