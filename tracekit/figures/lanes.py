"""The lanes of the timeline views (one per rank) and what is drawn on them besides the states:
pipeline bubbles as a thin strip at the top of a lane, the rank's events as one under it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
import plotly.graph_objects as go
import polars as pl

from tracekit.events import WORK_KINDS
from tracekit.figures.binning import merge_per_pixel
from tracekit.figures.style import (
    EVENT_COLORS,
    PHASE_COLORS,
    STATE_COLORS,
    STATE_LABELS,
    STATES,
    column,
    plain_expr,
    span_seconds,
    spans,
)

EVENT_KINDS = WORK_KINDS  # the events drawn in the zoomed timeline


def timeline_lanes(tl: pl.DataFrame) -> list[int]:
    """The ranks of a timeline in lane order (lane i shows ranks[i])."""
    return sorted(int(r) for r in tl.get_column("rank").unique().to_list())


def timeline_origin(tl: pl.DataFrame) -> int:
    """x = 0 of every timeline view: the earliest span start (ns)."""
    return int(cast(int, tl.get_column("start_ns").min()))  # a non-empty Int64 column


def lane_axis(lanes: Sequence[int]) -> dict:
    """The y axis of the lanes: top to bottom, at most about 40 rank labels."""
    step = max(1, math.ceil(len(lanes) / 40))
    idx = list(range(0, len(lanes), step))
    return dict(
        tickmode="array",
        tickvals=idx,
        ticktext=[f"rank {lanes[i]}" for i in idx],
        range=[len(lanes) - 0.5, -0.5],
        zeroline=False,
        showgrid=False,
    )


def lane_height(n: int) -> int:
    """Figure height for ``n`` lanes (pixels)."""
    return int(min(1100, max(360, 110 + 26 * n)))


def lane_positions(lane_of: dict[int, int], rank: pl.Series) -> np.ndarray:
    """The lane (y) of each row's rank."""
    return np.array([lane_of[int(r)] for r in rank.to_list()], dtype=np.float64)


def legend_traces(fig: go.Figure, states: Iterable[str] = STATES, **kw: Any) -> None:
    """One legend entry per state (the heatmap itself has no legend)."""
    for state in states:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=STATE_LABELS[state],
                marker=dict(symbol="square", size=12, color=STATE_COLORS[state]),
                hoverinfo="skip",
                showlegend=True,
                legendgroup=state,
                **kw,
            )
        )


def bubble_traces(
    bubbles: pl.DataFrame | None,
    lanes: Sequence[int],
    t0_ns: int,
    lo_ns: int,
    hi_ns: int,
    px_ns: float,
    cap: int,
) -> list[go.Bar]:
    """Pipeline bubbles as a thin strip at the top of each lane, one trace per phase."""
    if bubbles is None or bubbles.height == 0:
        return []
    lane_of = {int(r): i for i, r in enumerate(lanes)}
    b = bubbles.filter(
        (pl.col("end_ns") > lo_ns)
        & (pl.col("start_ns") < hi_ns)
        & pl.col("rank").is_in(list(lane_of))
    ).select(
        "rank",
        "phase",
        "start_ns",
        "end_ns",
        *[c for c in ("stage", "step") if c in bubbles.columns],
    )
    if b.height > cap:
        b = merge_per_pixel(b, px_ns, ["rank", "phase"])
    traces = []
    for phase in ("fill", "steady", "drain"):
        p = b.filter(pl.col("phase") == phase)
        if p.height == 0:
            continue
        p = p.sort("rank", "start_ns").head(cap)
        start, dur = span_seconds(p, t0_ns)
        custom = np.column_stack([p["rank"].to_numpy(), column(p, "stage", -1), dur * 1e6])
        traces.append(
            spans(
                start,
                dur,
                lane_positions(lane_of, p["rank"]) - 0.42,
                0.12,
                f"bubble: {phase}",
                PHASE_COLORS[phase],
                customdata=custom,
                legendgroup="bubble",
                hovertemplate=(
                    f"bubble ({phase})<br>rank %{{customdata[0]}} · stage %{{customdata[1]}}"
                    "<br>start %{base:.6f} s<br>%{customdata[2]:,.1f} µs<extra></extra>"
                ),
            )
        )
    return traces


def _event_hover(ev: pl.DataFrame) -> pl.Expr:
    dur_us = ((pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64) / 1000).round(1)
    parts = [
        plain_expr(pl.col("name")),
        pl.lit("<br>"),
        pl.col("kind").fill_null(""),
        pl.lit(" · "),
        dur_us.cast(pl.Utf8),
        pl.lit(" µs"),
        pl.lit("<br>rank "),
        pl.col("rank").cast(pl.Utf8),
    ]
    if "thread_name" in ev.columns:
        parts += [
            pl.lit(" · "),
            plain_expr(pl.coalesce(pl.col("thread_name"), pl.col("tid").cast(pl.Utf8))),
        ]
    if "op" in ev.columns:
        parts += [
            pl.when(pl.col("op").is_not_null())
            .then(pl.concat_str([pl.lit("<br>op "), plain_expr(pl.col("op"))]))
            .otherwise(pl.lit(""))
        ]
    if "bytes" in ev.columns:
        parts += [
            pl.when(pl.col("bytes").is_not_null())
            .then(pl.concat_str([pl.lit(" · "), pl.col("bytes").cast(pl.Utf8), pl.lit(" bytes")]))
            .otherwise(pl.lit(""))
        ]
    return pl.concat_str(parts).alias("hover")


def event_traces(
    events: pl.DataFrame | None,
    lane_of: dict[int, int],
    t0_ns: int,
    lo_ns: int,
    hi_ns: int,
    cap: int,
) -> tuple[list[go.Bar], int, int]:
    """The longest events in the window as a thin lane under each rank's states: the traces,
    how many events they draw and how many the window holds."""
    if events is None or events.height == 0:
        return [], 0, 0
    ev = events.filter(
        (pl.col("end_ns") > lo_ns)
        & (pl.col("start_ns") < hi_ns)
        & pl.col("rank").is_in(list(lane_of))
        & pl.col("kind").is_in(list(EVENT_KINDS))
    )
    if ev.height == 0:
        return [], 0, 0
    if "device" in ev.columns:  # GPU ranks: the timeline is built from GPU events; show those
        gpu = ev.filter(pl.col("device") == "gpu").get_column("rank").unique().to_list()
        if gpu:
            ev = ev.filter(~pl.col("rank").is_in(gpu) | (pl.col("device") == "gpu"))
    total = ev.height
    if total > cap:
        ev = (
            ev.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d"))
            .sort("_d", descending=True)
            .head(cap)
        )
    ev = ev.with_columns(_event_hover(ev))
    traces = []
    for kind in EVENT_KINDS:
        k = ev.filter(pl.col("kind") == kind)
        if k.height == 0:
            continue
        start, dur = span_seconds(k, t0_ns)
        traces.append(
            spans(
                start,
                dur,
                lane_positions(lane_of, k["rank"]) + 0.3,
                0.22,
                f"events: {kind}",
                EVENT_COLORS[kind],
                opacity=0.8,
                hovertext=k["hover"].to_list(),
                hoverinfo="text",
                legendgroup="events",
            )
        )
    return traces, min(total, cap), total
