"""The ``report`` section of params.yaml: how the report presents the runs (labels, panels, reference rows, the
papers' settings the runs were trained under).

Its own module, owned here (:data:`noisydml.schema.SECTION_OWNERS`) and imported only by the stages that load the
section (the report stage, ``noisydml check``): a change of the report's keys re-runs the report,
never a training run (every stage imports :mod:`noisydml.config`).
"""

from __future__ import annotations

from typing import Any, Mapping

from noisydml.schema import Field, ParamsError, SectionCheck, _check_value, check_section

#: ``report.settings_of``: the papers whose settings a profile can train under, or none (ours).
SETTINGS_OF = ("none", "prism", "sgps", "bspml")
UNCERTAINTY_SCHEMA = {
    "level": Field(float, 0.95, min=0.5, max=0.999, help="ours: the intervals' coverage"),
    "resamples": Field(int, 2000, min=100, help="ours: resamples of the bootstrap over test classes"),
    "seed": Field(int, 0, min=0, help="ours: the bootstrap's random seed"),
}
REPORT_SCHEMA = {
    "metrics": Field(list, ["precision_at_1", "mean_average_precision_at_r"], item_type=str),
    "settings_of": Field(str, "none", choices=SETTINGS_OF,
                         help="whose paper's settings this experiment's runs were trained under (a paper profile sets "
                              "it; a tag the report reads, so relabelling retrains nothing): a paper's cell is "
                              "filled only by a run with the tag of the paper whose number the cell holds "
                              "(references/papers/*.csv settings_of); other runs of its method show in a row of "
                              "their own. none: the default grid's settings (ours), which fill no paper cell"),
    "rehearsal": Field(bool, False, help="ours: true = a rehearsal (noisydml profile rehearse: miniature "
                                         "data, random weights); the report says its numbers mean nothing"),
    "labels": Field(dict, {}, help="ours: run name -> its row label in tables and figures (the papers' naming); "
                                   "runs not listed show their name"),
    "panels": Field(dict, {}, help="ours: figure panel title -> run names (at most 8 lines are drawn per panel, a "
                                   "longer one is split); runs in none are drawn in a panel 'other'"),
    "uncertainty": Field(dict, {"level": 0.95, "resamples": 2000, "seed": 0},
                         help="ours: the orderings' intervals (noisydml.reporting.uncertainty): level (0.95 = 95%), "
                              "resamples of the bootstrap over test classes, and its seed"),
    "reference_rows": Field(dict, {}, help="ours: run name -> what it is, for runs whose embedding is not a "
                                           "method's product (a phase that trains only a side module on a frozen "
                                           "backbone): shown beneath the methods for reference with that footnote, "
                                           "never bold, in no figure panel"),
}


def _check_report(section: Any, p: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``report``; that its metrics are metrics the evaluate stage computes is checked by the report stage and by
    :mod:`noisydml.tools.check` (it depends on ``evaluate.recall_at``)."""
    report = check_section(section, REPORT_SCHEMA, "report")
    for run, label in report["labels"].items():
        _check_value(label, Field(str), f"report.labels.{run}")
    for panel, runs in report["panels"].items():
        _check_value(runs, Field(list, item_type=str), f"report.panels.{panel}")
    report["uncertainty"] = check_section(report["uncertainty"], UNCERTAINTY_SCHEMA, "report.uncertainty")
    for run, what in report["reference_rows"].items():
        _check_value(what, Field(str), f"report.reference_rows.{run}")
        if not what.strip():
            raise ParamsError(f"report.reference_rows.{run}: {what!r}; allowed: a sentence saying what the row is "
                              "(its footnote under the main table)")
    return report


#: The section this module validates (:data:`noisydml.schema.SECTION_OWNERS`).
SECTION_CHECKS: dict[str, SectionCheck] = {"report": SectionCheck(_check_report)}
