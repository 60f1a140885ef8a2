"""``/timeline``: per-rank lanes, a binned overview; zooming returns real bars for the window.

A zoom reaches the server as plotly's relayoutData (through the ``timeline-zoom`` store), which
the browser sends and anything may forge: a window that is not two finite numbers is ignored
with a one-line note ("zoom ignored (...)"), never drawn and never an HTTP 500.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.io as pio
import polars as pl
from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboards.index import Summaries
from dashboards.pages.common import (
    View,
    figure,
    graph,
    guarded,
    nodata,
    run_header,
    runs_from_search,
)
from dashboards.root import Refused
from dashboards.runs import Runs
from tracekit import figures as F
from tracekit.errors import TracekitError


def page(view: View) -> list:
    fig = figure(view.run, "timeline")
    if fig is None:
        return [run_header(view), nodata(F.NO_DATA["timeline"])]
    meta = fig.layout.meta or {}
    info = (
        f"overview: {meta.get('segments', 0):,} spans in {meta.get('bins')} bins of "
        f"{F.fmt_s(meta.get('bin_s'))} per rank. Drag to zoom: real bars appear once the window "
        f"holds at most {F.MAX_BARS:,} spans; double-click to go back."
    )
    return [
        run_header(view),
        html.P(info, id="timeline-info", className="info"),
        dcc.Store(id="timeline-zoom"),
        graph(fig, "timeline-graph"),
    ]


def warm() -> None:
    """Build and serialize a tiny timeline: plotly creates its figure classes and loads its
    template on first use (~0.2 s), which the first visitor's page would wait for otherwise."""
    tiny = pl.DataFrame({"rank": [0], "start_ns": [0], "end_ns": [1], "state": ["compute"]})
    pio.to_json(F.timeline_overview(tiny), validate=False)


def _number(value: Any) -> float:
    """A finite axis value from relayoutData (the browser's: anything may arrive); ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a number: {value!r}"[:80])
    number = float(value)
    if not math.isfinite(number) or abs(number) > 1e18:
        raise ValueError(f"not a finite axis value: {value!r}"[:80])
    return number


def window(relayout: Mapping[str, Any], axis: str) -> tuple[float, float] | None:
    """``axis.range[0]``/``[1]`` or ``axis.range`` as two finite numbers; None when absent,
    ValueError when present but not two finite numbers."""
    if f"{axis}.range[0]" in relayout and f"{axis}.range[1]" in relayout:
        return _number(relayout[f"{axis}.range[0]"]), _number(relayout[f"{axis}.range[1]"])
    rng = relayout.get(f"{axis}.range")
    if rng is None:
        return None
    if isinstance(rng, (list, tuple)) and len(rng) == 2:
        return _number(rng[0]), _number(rng[1])
    raise ValueError("a range is two numbers")


def detail_figure(
    analysis: Any, relayout: Mapping[str, Any], overview: Any = None
) -> tuple[Any, str] | None:
    """The timeline figure for a relayout event (zoom: detail; autorange: ``overview``, built
    if not given), with its info line."""
    tl = F.frame(analysis, "timeline")
    if tl is None or tl.height == 0:
        return None
    bubbles, steps = F.frame(analysis, "bubbles"), F.frame(analysis, "steps")
    if relayout.get("xaxis.autorange"):
        fig = (
            overview
            if overview is not None
            else F.timeline_overview(tl, bubbles=bubbles, steps=steps)
        )
        assert fig is not None  # tl has spans
        meta = fig.layout.meta
        return fig, (
            f"overview: {meta['segments']:,} spans in {meta['bins']} bins of {F.fmt_s(meta['bin_s'])} "
            "per rank; drag to zoom"
        )
    xw = window(relayout, "xaxis")
    if xw is None:
        return None
    yw = window(relayout, "yaxis")
    lanes = F.timeline_lanes(tl)
    ranks = None
    if yw is not None:
        lo, hi = sorted(yw)
        ranks = [
            r for i, r in enumerate(lanes) if math.floor(lo) - 1 <= i <= math.ceil(hi) + 1
        ] or None
    fig = F.timeline_detail(
        tl,
        xw[0],
        xw[1],
        events=_events_in_window(analysis),
        bubbles=bubbles,
        steps=steps,
        ranks=ranks,
        y_range=yw,
    )
    assert fig is not None  # tl has spans
    meta = fig.layout.meta
    size = len(pio.to_json(fig, validate=False))
    if meta["mode"] == "detail":
        info = (
            f"detail: {meta['bars']:,} spans as bars and {meta['events']:,} events in "
            f"{F.fmt_s(abs(xw[1] - xw[0]))} (payload {size / 1024:.0f} KB)"
        )
    else:
        info = (
            f"binned: {meta['segments']:,} spans in this window (more than {F.MAX_BARS:,}); "
            f"zoom further for bars (payload {size / 1024:.0f} KB)"
        )
    return fig, info


def _events_in_window(analysis: Any) -> Any:
    """What the zoomed view draws as events: of an analysis that keeps each rank's events apart
    (tracekit.analysis.Analysis.rank_events), a reader of the shown ranks' events in the window
    only, so a zoom reads no other rank's events; else the events frame."""
    held = getattr(analysis, "events_at", None)
    if not held or "events" in vars(analysis):  # none apart, or all read already
        return F.frame(analysis, "events")

    def read(ranks: Sequence[int], lo: int, hi: int) -> pl.DataFrame | None:
        inside = (pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi)
        plans = [analysis.rank_events(r).filter(inside) for r in ranks if r in held]
        return pl.concat(plans, how="vertical").collect() if plans else None

    return read


def callbacks(app: Dash, runs: Runs, summaries: Summaries) -> None:
    """Zooming: the browser passes on zooms only, the server answers with the window's figure."""
    # Zooms only: plotly also reports autosize and legend clicks as relayout events, and a later
    # event supersedes an earlier one still in flight, so they are filtered in the browser and
    # only a new x range (or a reset) reaches the server.
    app.clientside_callback(
        """function(rd) {
            if (rd && (rd['xaxis.autorange'] || rd['xaxis.range'] !== undefined
                       || rd['xaxis.range[0]'] !== undefined)) { return rd; }
            return window.dash_clientside.no_update;
        }""",
        Output("timeline-zoom", "data"),
        Input("timeline-graph", "relayoutData"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output("timeline-graph", "figure"),
        Output("timeline-info", "children"),
        Input("timeline-zoom", "data"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    @guarded(lambda line: (no_update, f"could not draw this window: {line}"))
    def zoom(relayout: dict | None, search: str | None):
        chosen = runs_from_search(search)
        if not isinstance(relayout, dict) or not chosen:
            return no_update, no_update
        try:
            window(relayout, "xaxis"), window(relayout, "yaxis")
        except (ValueError, OverflowError) as exc:
            return no_update, f"zoom ignored ({exc})"
        try:
            entry = runs.entry(chosen[0])
        except (Refused, TracekitError):
            return no_update, no_update
        # going back shows the page's own overview, built once
        overview = figure(entry, "timeline") if relayout.get("xaxis.autorange") else None
        out = detail_figure(entry.analysis, relayout, overview)
        if out is None:
            return no_update, no_update
        return out
