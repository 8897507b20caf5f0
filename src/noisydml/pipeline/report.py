"""The report stage: tables (Markdown + CSV), noise statistics, plots, combined metrics -> ``reports/``."""

from __future__ import annotations

from pathlib import Path

from noisydml.pipeline.layout import Layout
from noisydml.reporting.tables import write_report


def report(params: dict, layout: Layout = Layout()) -> Path:
    return write_report(params, layout)
