"""``timing``: the training-time table (PRISM's Table 4 layout)."""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import Field, SectionCheck, check_choice, check_name, check_section, check_unique


TIMING_SCHEMA = {
    "dataset": Field(str, help="the dataset (in grid.datasets) every timed method trains on"),
    "noise": Field(str, help="the noise setting (in grid.noises) whose labels every timed method trains on"),
    "epochs": Field(int, 2, min=1, help="epochs per timed method; the first is not counted when there are more"),
    "entries": Field(dict, {}, help="name -> {label, method, hparams (overrides of methods.<method>)}; "
                                    "empty = no timing stage"),
}


TIMING_ENTRY_SCHEMA = {
    "label": Field(str),
    "method": Field(str),
    "hparams": Field(dict, {}),
}


def _check_timing(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """The training-time table (PRISM's Table 4 layout); each entry's hyper-parameters are validated by
    the timing stage, with its method's schema."""
    timing = check_section(section, TIMING_SCHEMA, "timing")
    check_choice(timing["dataset"], p["grid"]["datasets"], "timing.dataset", "dataset of grid.datasets")
    check_choice(timing["noise"], p["grid"]["noises"], "timing.noise", "noise setting",
                 " (the noise settings of grid.noises)")
    entries = {}
    for name, raw_entry in timing["entries"].items():
        where = f"timing.entries.{check_name(name, 'timing.entries')}"
        entry = check_section(raw_entry, TIMING_ENTRY_SCHEMA, where)
        check_choice(entry["method"], list(raw["methods"]), f"{where}.method", "method")
        entries[name] = entry
    check_unique([e["label"] for e in entries.values()], "timing.entries.*.label")
    timing["entries"] = entries
    return timing


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {
    "timing": SectionCheck(_check_timing, needs=("grid",)),
}
