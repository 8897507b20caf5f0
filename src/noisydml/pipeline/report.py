"""The report stage: tables (Markdown + CSV), noise statistics, plots, combined metrics -> ``reports/``, and
``reports/host.json``, the fingerprint of the host and numerics the report was made with (CI compares it with
its own host to know whether it must reproduce the committed metrics bit for bit)."""

from __future__ import annotations

from pathlib import Path

from noisydml import io
from noisydml.numerics import host_fingerprint
from noisydml.pipeline.layout import HOST_RECORD, Layout
from noisydml.reporting.tables import write_report


def report(params: dict, layout: Layout = Layout()) -> Path:
    out = write_report(params, layout)
    io.write_json(layout.reports / HOST_RECORD, host_fingerprint(params["runtime"]))
    return out
