"""``weights``: published backbone weights ``train.pretrained`` can name."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import Field, ParamsError, SectionCheck, check_name, check_section, check_sha256


#: Published backbone weights ``train.pretrained`` can name; the pretrain stage fetches and checks them.
WEIGHTS_SCHEMA = {
    "backbone": Field(str, help="the train.backbone these weights are for"),
    "url": Field(str, help="where the weights file is downloaded from (empty: put it in place by hand)"),
    "sha256": Field(str, help="the file's sha256: all 64 hex digits, or the prefix its publisher names the file "
                              "by (at least 8; torch hub's convention, e.g. resnet50-0676ba61.pth)"),
    "where": Field(str, "", help="where to get the file by hand when the url fails"),
}


def _check_weights(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, dict]:
    if not isinstance(section, Mapping):
        raise ParamsError(f"weights: expected a mapping of name -> {{backbone, url, sha256, where}}, got {section!r}")
    out = {}
    for name, body in section.items():
        where = f"weights.{check_name(name, 'weights')}"
        entry = check_section(body, WEIGHTS_SCHEMA, where)
        entry["sha256"] = check_sha256(entry["sha256"], f"{where}.sha256", min_digits=8)
        out[name] = entry
    return out


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "weights": SectionCheck(_check_weights),
}
