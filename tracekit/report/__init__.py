"""Reports of one run or a comparison of several: html, pdf, png, md, json, csv, parquet, perfetto.

``write_report(analyses, out, fmt)`` writes one file of the analyses given
(``tracekit.analyze``; ``Analysis.report(out)`` for one); several make a comparison report. Every format is written to
a temporary name beside OUT and renamed, so nothing half-written is ever left.

One module per output: ``write`` (the formats, atomic writing), ``tables`` (the tables, also
the Dash pages' and the CLI's, and the sections of a run), ``page`` (html: self-contained and
offline), ``static`` (pdf / png: the figures as images, printed by headless Chromium),
``markdown`` (md), ``data`` (json, csv, parquet, perfetto) and ``perfetto`` (the merged Chrome
trace).
"""

from __future__ import annotations

from tracekit.report.tables import (
    Table,
    collectives_table,
    compare_table,
    memory_table,
    overlap_table,
    pipeline_table,
    rank_table,
    top_events,
    traffic_table,
)
from tracekit.report.write import FORMATS, default_output, format_of, write_report

__all__ = [
    "FORMATS",
    "Table",
    "collectives_table",
    "compare_table",
    "default_output",
    "format_of",
    "memory_table",
    "overlap_table",
    "pipeline_table",
    "rank_table",
    "top_events",
    "traffic_table",
    "write_report",
]
