"""``/overlap``: all-gather / reduce-scatter hidden vs exposed per layer, and memory per rank."""

from __future__ import annotations

from dash import html

from dashboards.pages.common import View, fig_or_nodata, figure, run_header, table_if
from tracekit import report as R


def page(view: View) -> list:
    entry = view.run
    summary = entry.analysis.typed_summary
    overlap = figure(entry, "overlap")
    kids = [
        run_header(view),
        html.H3("all-gather / reduce-scatter overlap with compute"),
        fig_or_nodata(entry, "overlap", "fig-overlap"),
    ]
    t = R.overlap_table(summary)
    kids += table_if(t if overlap is not None else None)
    kids += [html.H3("memory"), fig_or_nodata(entry, "memory", "fig-memory")]
    return kids + table_if(R.memory_table(summary))
