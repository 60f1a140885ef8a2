"""``/traffic``: intra- vs inter-node bytes, the rank x rank matrix, bandwidth, transfer vs wait,
the collectives table, and tracekit predict's curve (what if the network were slower)."""

from __future__ import annotations

from typing import Any

from dash import html

from dashboards.pages.common import (
    View,
    fig_or_nodata,
    figure,
    graph,
    nodata,
    run_header,
    table,
    table_if,
)
from dashboards.runs import Entry
from tracekit import figures as F
from tracekit import report as R


def page(view: View) -> list:
    entry = view.run
    summary = entry.analysis.typed_summary
    split = figure(entry, "traffic_split")
    kids = [run_header(view), html.H3("traffic")]
    if split is None:
        kids.append(nodata(F.NO_DATA["traffic_split"]))
    else:
        kids += [
            graph(split, "fig-traffic-split"),
            fig_or_nodata(entry, "traffic_matrix", "fig-traffic-matrix"),
        ]
        kids += table_if(R.traffic_table(summary))
    return kids + [
        html.H3("collectives"),
        fig_or_nodata(entry, "collective_bandwidth", "fig-bandwidth"),
        fig_or_nodata(entry, "collective_time", "fig-collective-time"),
        table(R.collectives_table(summary)),
        html.H3("what if the network were slower (tracekit predict)"),
        _predict_curve(entry),
    ]


def _predict_curve(entry: Entry) -> Any:
    """tracekit predict's sweep for this run (tracekit.figures.prediction), built once."""
    from tracekit.figures import prediction as FP

    fig = entry.memoized("figure:predict_curve", lambda: FP.curve_for(entry.analysis))
    return graph(fig, "fig-predict-curve") if fig is not None else nodata(FP.NO_DATA)
