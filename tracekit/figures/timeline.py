"""The timeline page: per-rank lanes of states, fast at any size.

- **overview** (:func:`timeline_overview`): the binned heatmap of tracekit.figures.binning,
  plus the pipeline bubbles.
- **detail** (:func:`timeline_detail`): real spans as horizontal ``go.Bar`` bars (one trace per
  state, base = start, x = duration), plus a thin lane of the rank's events (name, duration,
  op, bytes on hover) and the pipeline bubbles. Only for a window with at most ``max_bars``
  spans; a wider window falls back to the binned view of that window.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import plotly.graph_objects as go
import polars as pl

from tracekit.figures.binning import MAX_BINS, heatmap_trace
from tracekit.figures.lanes import (
    bubble_traces,
    event_traces,
    lane_axis,
    lane_height,
    lane_positions,
    legend_traces,
    timeline_lanes,
    timeline_origin,
)
from tracekit.figures.read import frame
from tracekit.figures.style import (
    NS,
    STATE_COLORS,
    STATE_LABELS,
    STATES,
    fmt_s,
    layout,
    span_seconds,
    spans,
)

#: the events of some ranks in [lo_ns, hi_ns]: (ranks, lo_ns, hi_ns) -> frame (or None)
EventsInWindow = Callable[[Sequence[int], int, int], "pl.DataFrame | None"]

MAX_BARS = 3000  # state spans drawn as real bars in a detail window
MAX_EVENT_BARS = 2000  # events drawn in a detail window (the longest first)


#: The interactive timeline's hint; static images (PDF, PNG reports) cannot zoom: they drop it
ZOOM_HINT = "; zoom in for real spans"


def timeline_overview(
    tl: pl.DataFrame | None,
    *,
    bubbles: pl.DataFrame | None = None,
    steps: pl.DataFrame | None = None,
    bins: int = MAX_BINS,
    t0_ns: int | None = None,
    lanes: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    title: str | None = None,
) -> go.Figure | None:
    """Per-rank lanes, each time bin coloured by its dominant state (binned; fast at any size).

    ``window`` (lo_ns, hi_ns) bins only that part (the detail view's fallback); x is always
    seconds since ``t0_ns`` (default: the earliest span).
    """
    if tl is None or tl.height == 0:
        return None
    lanes = list(lanes) if lanes is not None else timeline_lanes(tl)
    t0 = timeline_origin(tl) if t0_ns is None else int(t0_ns)
    lo, hi = window if window is not None else (t0, int(cast(int, tl.get_column("end_ns").max())))
    trace, width, nbins = heatmap_trace(tl, lanes, t0, lo, hi, bins)
    fig = go.Figure(trace)
    legend_traces(fig)
    for t in bubble_traces(bubbles, lanes, t0, lo, hi, width, 2000):
        fig.add_trace(t)
    if title is None:
        title = (
            f"timeline of {len(lanes)} ranks: dominant state per {fmt_s(width * NS)} bin "
            f"(paler = less dominant{ZOOM_HINT})"
        )
    layout(
        fig,
        title,
        height=lane_height(len(lanes)),
        barmode="overlay",
        xaxis=dict(
            title="time since the window start",
            ticksuffix="s",
            range=[(lo - t0) * NS, (hi - t0) * NS],
        ),
        yaxis=lane_axis(lanes),
        uirevision="timeline",
    )
    n_steps = step_lines(fig, steps, t0, lo, hi)
    fig.update_layout(
        meta=dict(
            mode="overview" if window is None else "binned",
            steps=n_steps,
            bins=nbins,
            bin_s=width * NS,
            segments=int(tl.height),
            t0_ns=t0,
            lanes=lanes,
        )
    )
    return fig


def _state_bars(fig: go.Figure, seg: pl.DataFrame, lane_of: dict[int, int], t0: int) -> int:
    """The spans of ``seg`` as bars, one trace per state (empty ones keep the legend); the
    number of bars."""
    n_bars = 0
    for state in STATES:
        s = seg.filter(pl.col("state") == state)
        if s.height == 0:
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    x=[],
                    y=[],
                    base=[],
                    name=STATE_LABELS[state],
                    marker_color=STATE_COLORS[state],
                    legendgroup=state,
                )
            )
            continue
        n_bars += s.height
        start, dur = span_seconds(s, t0)
        custom = np.column_stack([s["rank"].to_numpy().astype(np.float64), dur * 1e6])
        fig.add_trace(
            spans(
                start,
                dur,
                lane_positions(lane_of, s["rank"]) - 0.1,
                0.5,
                STATE_LABELS[state],
                STATE_COLORS[state],
                customdata=custom,
                legendgroup=state,
                hovertemplate=(
                    f"{STATE_LABELS[state]}<br>rank %{{customdata[0]}}<br>start %{{base:.6f}} s"
                    "<br>duration %{customdata[1]:,.2f} µs<extra></extra>"
                ),
            )
        )
    return n_bars


def timeline_detail(
    tl: pl.DataFrame | None,
    start_s: float,
    end_s: float,
    *,
    t0_ns: int | None = None,
    events: pl.DataFrame | EventsInWindow | None = None,
    bubbles: pl.DataFrame | None = None,
    steps: pl.DataFrame | None = None,
    ranks: Sequence[int] | None = None,
    y_range: Sequence[float] | None = None,
    max_bars: int = MAX_BARS,
    max_events: int = MAX_EVENT_BARS,
) -> go.Figure | None:
    """Real spans of [start_s, end_s] (seconds since t0) as bars, or the binned view if too many.

    ``ranks`` limits the drawn lanes (the visible ones); lanes keep the overview's positions.
    ``events``: a frame, or a function of (ranks, lo_ns, hi_ns) that reads those ranks' events
    in that window, called only when bars are drawn (an app reads only the ranks zoomed into).
    """
    if tl is None or tl.height == 0:
        return None
    lanes = timeline_lanes(tl)
    t0 = timeline_origin(tl) if t0_ns is None else int(t0_ns)
    if end_s <= start_s:
        start_s, end_s = end_s, start_s
    lo = t0 + int(math.floor(start_s / NS))
    hi = max(lo + 1, t0 + int(math.ceil(end_s / NS)))
    shown = [r for r in lanes if ranks is None or r in set(ranks)] or lanes
    lane_of = {r: lanes.index(r) for r in shown}
    seg = tl.filter(
        (pl.col("end_ns") > lo) & (pl.col("start_ns") < hi) & pl.col("rank").is_in(shown)
    )
    yaxis = lane_axis(lanes)
    if y_range is not None and len(y_range) == 2:
        yaxis["range"] = [float(y_range[0]), float(y_range[1])]
    if seg.height > max_bars:
        binned = timeline_overview(
            tl.filter(pl.col("rank").is_in(shown)),
            bubbles=bubbles,
            steps=steps,
            t0_ns=t0,
            lanes=lanes,
            window=(lo, hi),
            title=(
                f"{seg.height:,} spans in this window (more than {max_bars:,}): dominant state per bin; "
                "zoom further for real spans"
            ),
        )
        if binned is not None:  # always: the window has spans
            # meta counts the spans of this window, not of the whole timeline
            binned.update_layout(
                yaxis=yaxis,
                xaxis_range=[start_s, end_s],
                meta={**binned.layout.meta, "segments": int(seg.height)},
            )
        return binned
    fig = go.Figure()
    n_bars = _state_bars(fig, seg, lane_of, t0)
    if callable(events):
        events = events(shown, lo, hi)
    ev_traces, n_events, ev_total = event_traces(events, lane_of, t0, lo, hi, max_events)
    for t in ev_traces:
        fig.add_trace(t)
    for t in bubble_traces(bubbles, lanes, t0, lo, hi, (hi - lo) / MAX_BINS, max_bars):
        fig.add_trace(t)
    more = (
        f" (the {n_events:,} longest of {ev_total:,} events)"
        if ev_total > n_events
        else f" and {n_events:,} events"
    )
    layout(
        fig,
        f"{n_bars:,} spans in {fmt_s((hi - lo) * NS)}{more}: hover for name, duration, op, bytes",
        height=lane_height(len(lanes)),
        barmode="overlay",
        bargap=0,
        xaxis=dict(title="time since the window start", ticksuffix="s", range=[start_s, end_s]),
        yaxis=yaxis,
        uirevision="timeline",
    )
    n_steps = step_lines(fig, steps, t0, lo, hi)
    fig.update_layout(
        meta=dict(
            mode="detail",
            steps=n_steps,
            bars=n_bars,
            events=n_events,
            segments=int(seg.height),
            t0_ns=t0,
            lanes=lanes,
        )
    )
    return fig


#: at most this many step boundaries are drawn in one view (more: none, they would be a wall)
MAX_STEP_LINES = 200


def step_lines(fig: go.Figure, steps: pl.DataFrame | None, t0: int, lo: int, hi: int) -> int:
    """A dotted line where each step of the job starts (summary.json ``steps``' frame: step,
    start_ns, end_ns), within [lo, hi]; the number drawn."""
    if steps is None or steps.height == 0:
        return 0
    shown = steps.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") <= hi))
    if shown.height > MAX_STEP_LINES:
        return 0
    for step, start in zip(shown["step"], shown["start_ns"], strict=True):
        fig.add_vline(
            x=(start - t0) * NS,
            line={"color": "#444", "width": 1, "dash": "dot"},
            annotation={"text": f"step {step}", "font": {"size": 10}},
            annotation_position="top right",
        )
    return shown.height


def timeline_of(analysis: Any) -> go.Figure | None:
    """The ``timeline`` figure of an Analysis: the binned overview of its merged timeline, with
    the job's step boundaries."""
    return timeline_overview(
        frame(analysis, "timeline"),
        bubbles=frame(analysis, "bubbles"),
        steps=frame(analysis, "steps"),
    )
