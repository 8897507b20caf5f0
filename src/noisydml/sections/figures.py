"""``figures``: sections the studies own (:mod:`noisydml.studies`), kept as written here."""

from __future__ import annotations

import copy
from typing import Any, Mapping

from noisydml.schema import SectionCheck, mapping_or_empty


def _check_figures(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``figures.<key>``: sections the studies own (noisydml.studies), validated by each study where it is used and
    all at once by noisydml.tools.check: editing a study's check re-runs that study's stages, not the grid."""
    return {key: copy.deepcopy(body) for key, body in
            mapping_or_empty(section, "figures", "study sections (noisydml.studies)").items()}


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "figures": SectionCheck(_check_figures),
}
