"""``tracking``: the MLflow experiment every run is logged under."""

from __future__ import annotations

from noisydml.schema import Field, SectionCheck, check_section


TRACKING_SCHEMA = {
    "experiment": Field(str, "noisydml"),
}


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "tracking": SectionCheck(lambda s, p, raw: check_section(s, TRACKING_SCHEMA, "tracking")),
}
