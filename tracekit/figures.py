"""Figures: plotly only, no Dash. Pure functions from an analysis' summary and frames to go.Figure.

The Dash app (dashboards/app.py) and the report (tracekit/report.py) both call these; nothing
here reads files or knows about pages. A function returns ``None`` when its section of the
summary is null or its frame is absent; callers then show :data:`NO_DATA`'s plain sentence.

Trace strings (event names, layer units, run names) go into figures as data only: they pass
through :func:`plain`, which turns ``& < >`` into entities that plotly.js decodes back to text,
so plotly's pseudo-HTML (``<b>``, ``<a href>``) never sees a tag that came from a trace.

The timeline stays fast at any size:

- **overview** (:func:`timeline_overview`): the timeline is cut into at most 2,000 time bins
  per lane (100,000 cells in all) by :func:`bin_states`, loop-free (segments crossing bins are
  split exactly); each cell takes the colour of the state that fills most of the bin, paler
  when it fills less, and its hover lists every state's share. One heatmap trace, typed
  arrays: 64 ranks x 1,562 bins is about 1.5 MB and draws in well under a second.
- **detail** (:func:`timeline_detail`): real spans as horizontal ``go.Bar`` bars (one trace per
  state, base = start, x = duration), plus a thin lane of the rank's events (name, duration,
  op, bytes on hover) and the pipeline bubbles. Only for a window with at most ``max_bars``
  spans; a wider window falls back to the binned view of that window. (Bars beat layout shapes
  by far in Chromium: every shape is its own SVG node and relayout redraws them all.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from tracekit.analyses.group_names import row_label

NS = 1e-9
STATES = ("compute", "overlap", "comm", "other", "idle")
STATE_CODE = {s: i for i, s in enumerate(STATES)}
STATE_LABELS = {
    "compute": "compute",
    "overlap": "compute + comm (overlap)",
    "comm": "exposed comm",
    "other": "other (memcpy/memset/sync)",
    "idle": "idle",
}
STATE_COLORS = {
    "compute": "#2e8b3e",
    "overlap": "#1f9fb4",
    "comm": "#d62728",
    "other": "#8c6bb1",
    "idle": "#c8c8c8",
}
PHASE_COLORS = {"fill": "#e8590c", "steady": "#f2b701", "drain": "#7f3c8d"}
KIND_COLORS = {"F": "#4c78a8", "B": "#f58518", "W": "#54a24b"}
KIND_LABELS = {"F": "forward", "B": "backward", "W": "weight grad"}
EVENT_COLORS = {
    "compute": "#3b3b3b",
    "communication": "#a50f15",
    "memory": "#6a51a3",
    "sync": "#6a51a3",
}
MEMORY_PARTS = (
    ("params_bytes", "params", "#4c78a8"),
    ("grads_bytes", "grads", "#f58518"),
    ("optimizer_bytes", "optimizer", "#54a24b"),
    ("activation_peak_bytes", "activations (peak)", "#b279a2"),
)
LINK_COLORS = {"intra": "#4c78a8", "inter": "#e45756"}

MAX_BINS = 2000  # cells per lane in the binned views
MAX_CELLS = 100_000  # cells per binned view (64 lanes: 1,562 bins; ~1.3 MB of typed arrays)
MAX_BARS = 3000  # state spans drawn as real bars in a detail window
MAX_EVENT_BARS = 2000  # events drawn in a detail window (the longest first)
MAX_OPS = 6000  # pipeline ops drawn

NO_DATA = {
    "timeline": "this run has no timeline data",
    "breakdown": "this run has no per-rank data",
    "pipeline": "this run has no pipeline data",
    "pipeline_stages": "this run has no pipeline data",
    "overlap": "this run has no overlap data (ZeRO-3 / FSDP / HSDP runs have it)",
    "memory": "this run has no memory data",
    "traffic_split": "this run has no traffic data",
    "traffic_matrix": "this run has no traffic data",
    "collective_bandwidth": "this run has no collectives data",
    "collective_time": "this run has no collectives data",
}

_BASE_LAYOUT = dict(
    template="plotly_white",
    margin=dict(l=70, r=20, t=60, b=50),
    font=dict(size=12),
    legend=dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.01),
)


# ---------------------------------------------------------------- helpers


def plain(text: Any) -> str:
    """Trace text as plotly shows it literally: ``& < >`` as entities (plotly.js decodes them)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain_expr(expr: pl.Expr) -> pl.Expr:
    return (
        expr.cast(pl.Utf8)
        .fill_null("")
        .str.replace_all("&", "&amp;", literal=True)
        .str.replace_all("<", "&lt;", literal=True)
        .str.replace_all(">", "&gt;", literal=True)
    )


def frame(analysis: Any, name: str) -> pl.DataFrame | None:
    """A frame of an Analysis by name (attribute, or an entry of ``tables()``), or None."""
    value = getattr(analysis, name, None)
    if isinstance(value, pl.DataFrame):
        return value
    for attr in ("frames", "extra_frames"):
        d = getattr(analysis, attr, None)
        if isinstance(d, dict) and isinstance(d.get(name), pl.DataFrame):
            return d[name]
    tables = getattr(analysis, "tables", None)
    if callable(tables):
        try:
            value = tables().get(name)
        except Exception:  # a half-built analysis: no such frame
            value = None
        if isinstance(value, pl.DataFrame):
            return value
    return None


UNKNOWN = "–"  # how every unknown (null) value is shown: never 0, never a guess


def fmt_bytes(n: Any) -> str:
    if n is None:
        return UNKNOWN
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def fmt_s(x: Any) -> str:
    if x is None:
        return UNKNOWN
    x = float(x)
    if abs(x) >= 1:
        return f"{x:.3f} s"
    if abs(x) >= 1e-3:
        return f"{x * 1e3:.3f} ms"
    return f"{x * 1e6:.1f} µs"


def fmt_frac(x: Any) -> str:
    return UNKNOWN if x is None else f"{100 * float(x):.1f}%"


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def _mix(color: str, other: str, t: float) -> str:
    a = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))


def _layout(fig: go.Figure, title: str, height: int = 420, **kw: Any) -> go.Figure:
    fig.update_layout(**_BASE_LAYOUT)
    fig.update_layout(
        title=dict(text=title, x=0, xanchor="left", font=dict(size=15)), height=height, **kw
    )
    return fig


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    """Decimal units, as the tables and GB/s use."""
    for div, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if max_bytes >= div:
            return div, name
    return 1.0, "B"


# ---------------------------------------------------------------- per-rank breakdown


def breakdown(summary: dict) -> go.Figure | None:
    """Per rank: compute, overlap, exposed comm, other, idle stacked to the span (seconds)."""
    ranks = summary.get("ranks") or []
    if not ranks:
        return None
    x = [f"rank {r['rank']}" for r in ranks]
    parts = {
        "compute": [_num(r.get("compute_s")) - _num(r.get("overlap_s")) for r in ranks],
        "overlap": [_num(r.get("overlap_s")) for r in ranks],
        "comm": [_num(r.get("exposed_comm_s")) for r in ranks],
        "other": [_num(r.get("other_s")) for r in ranks],
        "idle": [_num(r.get("idle_s")) for r in ranks],
    }
    fig = go.Figure()
    for state, values in parts.items():
        fig.add_trace(
            go.Bar(
                x=x,
                y=values,
                name=STATE_LABELS[state],
                marker_color=STATE_COLORS[state],
                hovertemplate="%{x}<br>" + STATE_LABELS[state] + ": %{y:.6f} s<extra></extra>",
            )
        )
    win = summary.get("window") or {}
    return _layout(
        fig,
        f"time per rank over the window ({win.get('kind', '?')}, {win.get('steps', 0)} steps)",
        barmode="stack",
        yaxis_title="seconds",
    )


# ---------------------------------------------------------------- timeline


def timeline_lanes(tl: pl.DataFrame) -> list[int]:
    """The ranks of a timeline in lane order (lane i shows ranks[i])."""
    return sorted(int(r) for r in tl.get_column("rank").unique().to_list())


def timeline_origin(tl: pl.DataFrame) -> int:
    """x = 0 of every timeline view: the earliest span start (ns)."""
    return int(tl.get_column("start_ns").min())


def _lane_axis(lanes: Sequence[int]) -> dict:
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


def _lane_height(n: int) -> int:
    return int(min(1100, max(360, 110 + 26 * n)))


def bin_states(
    tl: pl.DataFrame, lanes: Sequence[int], lo_ns: int, hi_ns: int, bins: int
) -> np.ndarray:
    """Nanoseconds of each state per lane and bin of [lo_ns, hi_ns): array (lanes, bins, 5).

    Exact and loop-free, however many bins a span crosses: a span adds its part of the bin it
    starts in, removes the part of the bin it ends in that lies after its end, and counts as
    open (one full bin width) in every bin after its start bin and up to its end bin. Per
    (lane, state) that is two ``np.bincount`` over the starts and ends and one ``cumsum`` over
    the bins, whatever the number of spans.
    """
    n_lanes, n_states = len(lanes), len(STATES)
    if hi_ns <= lo_ns or tl.height == 0 or n_lanes == 0:
        return np.zeros((n_lanes, bins, n_states), dtype=np.float64)
    width = (hi_ns - lo_ns) / bins
    # positions in bins since lo_ns; int64 ns are made relative before the cast (float64
    # holds absolute epoch ns only to ~256 ns)
    f = tl.filter((pl.col("end_ns") > lo_ns) & (pl.col("start_ns") < hi_ns)).select(
        pl.col("rank").cast(pl.Int64),
        pl.col("state")
        .replace_strict(STATE_CODE, default=STATE_CODE["idle"], return_dtype=pl.Int64)
        .alias("code"),
        ((pl.col("start_ns").clip(lower_bound=lo_ns) - lo_ns).cast(pl.Float64) / width).alias("s"),
        ((pl.col("end_ns").clip(upper_bound=hi_ns) - lo_ns).cast(pl.Float64) / width).alias("e"),
    )
    rank = f["rank"].to_numpy()
    # rank -> lane by a search in the sorted lanes: a table indexed by rank would be as long
    # as the largest rank number (2^31 for a trace that says so)
    lane_of = np.asarray(lanes, dtype=np.int64)
    by = np.argsort(lane_of, kind="stable")
    at = np.clip(np.searchsorted(lane_of[by], rank), 0, n_lanes - 1)
    lane = np.where(lane_of[by][at] == rank, by[at], -1)
    s_, e_ = f["s"].to_numpy(), f["e"].to_numpy()
    keep = (lane >= 0) & (e_ > s_)
    row = (lane * n_states + f["code"].to_numpy())[keep]  # (lane, state) row of the result
    s_, e_ = s_[keep], e_[keep]
    # one extra bin for spans ending at hi_ns exactly; dropped at the end
    width1 = bins + 1
    b0 = np.minimum(s_.astype(np.int64), bins)
    b1 = np.minimum(e_.astype(np.int64), bins)
    at_start, at_end = row * width1 + b0, row * width1 + b1
    size = n_lanes * n_states * width1
    part = np.bincount(at_start, weights=(b0 + 1) - s_, minlength=size) - np.bincount(
        at_end, weights=(b1 + 1) - e_, minlength=size
    )
    opened = np.bincount(at_start, minlength=size) - np.bincount(at_end, minlength=size)
    part, opened = part.reshape(-1, width1), opened.reshape(-1, width1)
    open_before = np.cumsum(opened, axis=1) - opened  # spans open at each bin's left edge
    out = np.maximum((part + open_before)[:, :bins] * width, 0.0)
    return out.reshape(n_lanes, n_states, bins).transpose(0, 2, 1)


def _state_colorscale() -> list[list]:
    """z = code + share: each state a band from pale (fills little of its bin) to full colour."""
    scale: list[list] = []
    n = len(STATES)
    for code, state in enumerate(STATES):
        full = STATE_COLORS[state]
        scale.append([code / n, _mix(full, "#ffffff", 0.6)])
        scale.append([(code + 0.999) / n, full])
    scale[-1][0] = 1.0
    return scale


def _legend_traces(fig: go.Figure, states: Iterable[str] = STATES, **kw: Any) -> None:
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


def _heatmap_trace(
    tl: pl.DataFrame, lanes: Sequence[int], t0_ns: int, lo_ns: int, hi_ns: int, bins: int
) -> tuple[go.Heatmap, float, int]:
    bins = int(max(1, min(bins, MAX_BINS, MAX_CELLS // max(1, len(lanes)), hi_ns - lo_ns)))
    width = (hi_ns - lo_ns) / bins
    ns = bin_states(tl, lanes, lo_ns, hi_ns, bins)
    shares = ns / width
    total = shares.sum(axis=2)
    dominant = shares.argmax(axis=2)
    dom_share = np.clip(shares.max(axis=2), 0.0, 1.0)
    z = np.where(total > 0.01, dominant + 0.999 * dom_share, np.nan).astype(np.float32)
    big = max(lanes, default=0) > 255
    custom = np.empty((len(lanes), bins, len(STATES) + 1), dtype=np.uint16 if big else np.uint8)
    custom[:, :, : len(STATES)] = np.rint(np.clip(shares, 0, 1) * 100)
    custom[:, :, len(STATES)] = np.asarray(lanes, dtype=np.int64)[:, None]
    x = ((lo_ns - t0_ns) + (np.arange(bins) + 0.5) * width) * NS
    hover = (
        "rank %{customdata[5]} · t = %{x:.6f} s<br>"
        + "<br>".join(f"{STATE_LABELS[s]}: %{{customdata[{i}]}}%" for i, s in enumerate(STATES))
        + "<extra></extra>"
    )
    trace = go.Heatmap(
        x=x,
        y=np.arange(len(lanes)),
        z=z,
        customdata=custom,
        zmin=0,
        zmax=len(STATES),
        colorscale=_state_colorscale(),
        showscale=False,
        hoverongaps=False,
        hovertemplate=hover,
        name="timeline (binned)",
    )
    return trace, width, bins


def _merge_per_pixel(spans: pl.DataFrame, px_ns: float, keys: Sequence[str]) -> pl.DataFrame:
    """Spans of one key closer than a pixel merged into one (start_ns, end_ns, count)."""
    if spans.height == 0:
        return spans.with_columns(pl.lit(0, pl.UInt32).alias("count"))
    return (
        spans.sort(*keys, "start_ns")
        .with_columns(pl.col("end_ns").cum_max().over(keys).shift(1).over(keys).alias("_prev"))
        .with_columns(
            (pl.col("_prev").is_null() | (pl.col("start_ns") > pl.col("_prev") + px_ns))
            .cum_sum()
            .over(keys)
            .alias("_g")
        )
        .group_by(*keys, "_g")
        .agg(
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.len().alias("count"),
            *[pl.col(c).first() for c in spans.columns if c not in (*keys, "start_ns", "end_ns")],
        )
        .drop("_g")
    )


def _bubble_traces(
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
        b = _merge_per_pixel(b, px_ns, ["rank", "phase"])
    traces = []
    for phase in ("fill", "steady", "drain"):
        p = b.filter(pl.col("phase") == phase)
        if p.height == 0:
            continue
        p = p.sort("rank", "start_ns").head(cap)
        start = (p["start_ns"] - t0_ns).to_numpy() * NS
        dur = (p["end_ns"] - p["start_ns"]).to_numpy() * NS
        lane = np.array([lane_of[int(r)] for r in p["rank"].to_list()], dtype=np.float64)
        stage = (
            p["stage"].fill_null(-1).to_numpy() if "stage" in p.columns else np.full(p.height, -1)
        )
        custom = np.column_stack([p["rank"].to_numpy(), stage, dur * 1e6])
        traces.append(
            go.Bar(
                orientation="h",
                base=start,
                x=dur,
                y=lane - 0.42,
                width=0.12,
                marker=dict(color=PHASE_COLORS[phase], line=dict(width=0)),
                name=f"bubble: {phase}",
                customdata=custom,
                legendgroup="bubble",
                hovertemplate=(
                    f"bubble ({phase})<br>rank %{{customdata[0]}} · stage %{{customdata[1]}}"
                    "<br>start %{base:.6f} s<br>%{customdata[2]:,.1f} µs<extra></extra>"
                ),
            )
        )
    return traces


def timeline_overview(
    tl: pl.DataFrame | None,
    *,
    bubbles: pl.DataFrame | None = None,
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
    lo, hi = window if window is not None else (t0, int(tl.get_column("end_ns").max()))
    trace, width, nbins = _heatmap_trace(tl, lanes, t0, lo, hi, bins)
    fig = go.Figure(trace)
    _legend_traces(fig)
    for t in _bubble_traces(bubbles, lanes, t0, lo, hi, width, 2000):
        fig.add_trace(t)
    if title is None:
        title = (
            f"timeline of {len(lanes)} ranks: dominant state per {fmt_s(width * NS)} bin "
            "(paler = less dominant; zoom in for real spans)"
        )
    _layout(
        fig,
        title,
        height=_lane_height(len(lanes)),
        barmode="overlay",
        xaxis=dict(
            title="time since the window start",
            ticksuffix="s",
            range=[(lo - t0) * NS, (hi - t0) * NS],
        ),
        yaxis=_lane_axis(lanes),
        uirevision="timeline",
    )
    fig.update_layout(
        meta=dict(
            mode="overview" if window is None else "binned",
            bins=nbins,
            bin_s=width * NS,
            segments=int(tl.height),
            t0_ns=t0,
            lanes=lanes,
        )
    )
    return fig


def _event_hover(ev: pl.DataFrame) -> pl.Expr:
    dur_us = ((pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64) / 1000).round(1)
    parts = [
        _plain_expr(pl.col("name")),
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
            _plain_expr(pl.coalesce(pl.col("thread_name"), pl.col("tid").cast(pl.Utf8))),
        ]
    if "op" in ev.columns:
        parts += [
            pl.when(pl.col("op").is_not_null())
            .then(pl.concat_str([pl.lit("<br>op "), _plain_expr(pl.col("op"))]))
            .otherwise(pl.lit(""))
        ]
    if "bytes" in ev.columns:
        parts += [
            pl.when(pl.col("bytes").is_not_null())
            .then(pl.concat_str([pl.lit(" · "), pl.col("bytes").cast(pl.Utf8), pl.lit(" bytes")]))
            .otherwise(pl.lit(""))
        ]
    return pl.concat_str(parts).alias("hover")


def _event_traces(
    events: pl.DataFrame | None,
    lane_of: dict[int, int],
    t0_ns: int,
    lo_ns: int,
    hi_ns: int,
    cap: int,
) -> tuple[list[go.Bar], int, int]:
    """The longest events in the window as a thin lane under each rank's states."""
    if events is None or events.height == 0:
        return [], 0, 0
    ev = events.filter(
        (pl.col("end_ns") > lo_ns)
        & (pl.col("start_ns") < hi_ns)
        & pl.col("rank").is_in(list(lane_of))
        & pl.col("kind").is_in(["compute", "communication", "memory", "sync"])
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
    for kind in ("compute", "communication", "memory", "sync"):
        k = ev.filter(pl.col("kind") == kind)
        if k.height == 0:
            continue
        lane = np.array([lane_of[int(r)] for r in k["rank"].to_list()], dtype=np.float64)
        traces.append(
            go.Bar(
                orientation="h",
                base=(k["start_ns"] - t0_ns).to_numpy() * NS,
                x=(k["end_ns"] - k["start_ns"]).to_numpy() * NS,
                y=lane + 0.3,
                width=0.22,
                marker=dict(color=EVENT_COLORS[kind], line=dict(width=0)),
                opacity=0.8,
                name=f"events: {kind}",
                hovertext=k["hover"].to_list(),
                hoverinfo="text",
                legendgroup="events",
            )
        )
    return traces, min(total, cap), total


def timeline_detail(
    tl: pl.DataFrame | None,
    start_s: float,
    end_s: float,
    *,
    t0_ns: int | None = None,
    events: pl.DataFrame | None = None,
    bubbles: pl.DataFrame | None = None,
    ranks: Sequence[int] | None = None,
    y_range: Sequence[float] | None = None,
    max_bars: int = MAX_BARS,
    max_events: int = MAX_EVENT_BARS,
) -> go.Figure | None:
    """Real spans of [start_s, end_s] (seconds since t0) as bars, or the binned view if too many.

    ``ranks`` limits the drawn lanes (the visible ones); lanes keep the overview's positions.
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
    yaxis = _lane_axis(lanes)
    if y_range is not None and len(y_range) == 2:
        yaxis["range"] = [float(y_range[0]), float(y_range[1])]
    if seg.height > max_bars:
        fig = timeline_overview(
            tl.filter(pl.col("rank").is_in(shown)),
            bubbles=bubbles,
            t0_ns=t0,
            lanes=lanes,
            window=(lo, hi),
            title=(
                f"{seg.height:,} spans in this window (more than {max_bars:,}): dominant state per bin; "
                "zoom further for real spans"
            ),
        )
        # meta counts the spans of this window, not of the whole timeline
        fig.update_layout(
            yaxis=yaxis,
            xaxis_range=[start_s, end_s],
            meta={**fig.layout.meta, "segments": int(seg.height)},
        )
        return fig
    fig = go.Figure()
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
        start = (s["start_ns"] - t0).to_numpy() * NS
        dur = (s["end_ns"] - s["start_ns"]).to_numpy() * NS
        lane = np.array([lane_of[int(r)] for r in s["rank"].to_list()], dtype=np.float64)
        custom = np.column_stack([s["rank"].to_numpy().astype(np.float64), dur * 1e6])
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=start,
                x=dur,
                y=lane - 0.1,
                width=0.5,
                marker=dict(color=STATE_COLORS[state], line=dict(width=0)),
                name=STATE_LABELS[state],
                customdata=custom,
                legendgroup=state,
                hovertemplate=(
                    f"{STATE_LABELS[state]}<br>rank %{{customdata[0]}}<br>start %{{base:.6f}} s"
                    "<br>duration %{customdata[1]:,.2f} µs<extra></extra>"
                ),
            )
        )
    ev_traces, n_events, ev_total = _event_traces(events, lane_of, t0, lo, hi, max_events)
    for t in ev_traces:
        fig.add_trace(t)
    for t in _bubble_traces(bubbles, lanes, t0, lo, hi, (hi - lo) / MAX_BINS, max_bars):
        fig.add_trace(t)
    more = (
        f" (the {n_events:,} longest of {ev_total:,} events)"
        if ev_total > n_events
        else f" and {n_events:,} events"
    )
    _layout(
        fig,
        f"{n_bars:,} spans in {fmt_s((hi - lo) * NS)}{more}: hover for name, duration, op, bytes",
        height=_lane_height(len(lanes)),
        barmode="overlay",
        bargap=0,
        xaxis=dict(title="time since the window start", ticksuffix="s", range=[start_s, end_s]),
        yaxis=yaxis,
        uirevision="timeline",
    )
    fig.update_layout(
        meta=dict(
            mode="detail",
            bars=n_bars,
            events=n_events,
            segments=int(seg.height),
            t0_ns=t0,
            lanes=lanes,
        )
    )
    return fig


def timeline(
    tl: pl.DataFrame | None, *, window: tuple[float, float] | None = None, **kw: Any
) -> go.Figure | None:
    """The overview, or with ``window=(start_s, end_s)`` the detail of that window."""
    if window is None:
        kw.pop("events", None)
        kw.pop("ranks", None)
        kw.pop("y_range", None)
        return timeline_overview(tl, **kw)
    return timeline_detail(tl, window[0], window[1], **kw)


# ---------------------------------------------------------------- pipeline


def pipeline_theory_text(p: dict) -> str:
    stages, m = p.get("stages"), p.get("microbatches")
    parts = [f"measured {fmt_frac(p.get('bubble_fraction'))} (pipeline windows)"]
    if p.get("bubble_fraction_span") is not None:
        parts.append(f"whole span {fmt_frac(p.get('bubble_fraction_span'))}")
    parts.append(f"replay {fmt_frac(p.get('bubble_fraction_replay'))}")
    parts.append(
        f"theory (p-1)/(m+p-1) {fmt_frac(p.get('bubble_fraction_theory'))}"
        + (f" with p={stages}, m={m}" if stages and m else "")
    )
    return "bubble fraction: " + " · ".join(parts)


def _ops_bars(
    fig: go.Figure,
    ops: pl.DataFrame,
    key_cols: list[str],
    lanes: dict[tuple, int],
    t0: float,
    *,
    time_unit: str,
    row: int,
    showlegend: bool,
) -> None:
    for kind in ("F", "B", "W"):
        k = ops.filter(pl.col("kind") == kind)
        if k.height == 0:
            continue
        if time_unit == "ns":
            start = (k["start_ns"] - t0).to_numpy() * NS
            dur = (k["end_ns"] - k["start_ns"]).to_numpy() * NS
        else:
            start = k["start_s"].to_numpy() - t0
            dur = k["end_s"].to_numpy() - k["start_s"].to_numpy()
        y = np.array([lanes[key] for key in k.select(key_cols).rows()], dtype=np.float64)
        mb = k["microbatch"].fill_null(-1).to_numpy()
        stage = k["stage"].fill_null(-1).to_numpy()
        step = k["step"].fill_null(-1).to_numpy() if "step" in k.columns else np.full(k.height, -1)
        version = (
            k["version"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
            if "version" in k.columns
            else np.full(k.height, np.nan)
        )
        custom = np.column_stack([stage, mb, step, dur * 1e3, version])
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=start,
                x=dur,
                y=y,
                width=0.7,
                marker=dict(color=KIND_COLORS[kind], line=dict(width=0.5, color="white")),
                text=[str(int(v)) for v in mb],
                textposition="inside",
                insidetextanchor="middle",
                textfont=dict(color="white", size=10),
                constraintext="inside",
                name=KIND_LABELS[kind],
                legendgroup=kind,
                showlegend=showlegend,
                customdata=custom,
                hovertemplate=(
                    f"{KIND_LABELS[kind]} ({kind}) microbatch %{{customdata[1]}}<br>stage %{{customdata[0]}}"
                    " · step %{customdata[2]} · weight version %{customdata[4]}"
                    "<br>start %{base:.6f} s · %{customdata[3]:.3f} ms<extra></extra>"
                ),
            ),
            row=row,
            col=1,
        )


def pipeline_schedule(
    summary: dict,
    ops: pl.DataFrame | None,
    bubbles: pl.DataFrame | None = None,
    replay: pl.DataFrame | None = None,
) -> go.Figure | None:
    """Stage x time: F/B/W per microbatch, bubbles (fill/steady/drain), and the replayed schedule."""
    p = summary.get("pipeline")
    if ops is None or ops.height == 0 or not p:
        return None
    ops = ops.sort("start_ns")
    cut = ops.height > MAX_OPS
    if cut:
        ops = ops.head(MAX_OPS)
    key_cols = ["stage", "rank"] if "rank" in ops.columns else ["stage"]
    keys = ops.select(key_cols).unique().sort(key_cols).rows()
    lanes = {k: i for i, k in enumerate(keys)}
    labels = [f"stage {k[0]}" + (f" (rank {k[1]})" if len(k) > 1 else "") for k in keys]
    has_replay = replay is not None and replay.height > 0
    fig = make_subplots(
        rows=2 if has_replay else 1,
        cols=1,
        vertical_spacing=0.14,
        subplot_titles=["measured"]
        + (["replayed with measured F/B durations, free communication"] if has_replay else []),
        row_heights=[0.6, 0.4] if has_replay else None,
    )
    t0 = int(ops["start_ns"].min())
    if bubbles is not None and bubbles.height and all(c in bubbles.columns for c in key_cols):
        bub = bubbles.filter(pl.col("end_ns") > pl.col("start_ns"))
        for phase in ("fill", "steady", "drain"):
            b = bub.filter(pl.col("phase") == phase).head(MAX_OPS)
            ys = [lanes.get(k) for k in b.select(key_cols).rows()]
            b = b.filter(pl.Series([y is not None for y in ys], dtype=pl.Boolean))
            if b.height == 0:
                continue
            ys = np.array([y for y in ys if y is not None], dtype=np.float64)
            dur = (b["end_ns"] - b["start_ns"]).to_numpy() * NS
            step = (
                b["step"].fill_null(-1).to_numpy() if "step" in b.columns else np.full(b.height, -1)
            )
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    base=(b["start_ns"] - t0).to_numpy() * NS,
                    x=dur,
                    y=ys,
                    width=0.9,
                    marker=dict(
                        color=PHASE_COLORS[phase],
                        opacity=0.35,
                        line=dict(width=0),
                        pattern=dict(shape="/", fgcolor=PHASE_COLORS[phase], fgopacity=0.6),
                    ),
                    name=f"bubble: {phase}",
                    legendgroup=f"bubble-{phase}",
                    customdata=np.column_stack([step, dur * 1e3]),
                    hovertemplate=(
                        f"bubble ({phase})<br>step %{{customdata[0]}} · %{{customdata[1]:.3f}} ms"
                        "<extra></extra>"
                    ),
                ),
                row=1,
                col=1,
            )
    _ops_bars(fig, ops, key_cols, lanes, t0, time_unit="ns", row=1, showlegend=True)
    n = len(keys)
    if has_replay:
        stages = sorted(int(s) for s in replay["stage"].unique().to_list())
        _ops_bars(
            fig,
            replay,
            ["stage"],
            {(s,): i for i, s in enumerate(stages)},
            float(replay["start_s"].min()),
            time_unit="s",
            row=2,
            showlegend=False,
        )
        fig.update_yaxes(
            tickmode="array",
            tickvals=list(range(len(stages))),
            ticktext=[f"stage {s}" for s in stages],
            autorange="reversed",
            row=2,
            col=1,
        )
        fig.update_xaxes(title_text="time (replay)", ticksuffix="s", row=2, col=1)
        n += len(stages)
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(keys))),
        ticktext=labels,
        autorange="reversed",
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text="time since the first op", ticksuffix="s", row=1, col=1)
    title = (
        f"pipeline schedule: {plain(p.get('schedule', '?'))}, {p.get('stages', '?')} stages, "
        f"{p.get('microbatches', '?')} microbatches" + (f" (first {MAX_OPS:,} ops)" if cut else "")
    )
    _layout(fig, title, height=int(min(1100, 300 + 46 * n)), barmode="overlay")
    fig.add_annotation(
        text=plain(pipeline_theory_text(p)),
        xref="paper",
        yref="paper",
        x=0,
        y=1.0,
        yshift=34,
        showarrow=False,
        xanchor="left",
        font=dict(size=12),
    )
    fig.update_layout(margin=dict(t=110))
    return fig


def pipeline_stages(summary: dict) -> go.Figure | None:
    """Per stage: fill / steady / drain bubble seconds, and in-flight microbatches."""
    p = summary.get("pipeline")
    rows = (p or {}).get("per_stage") or []
    if not rows:
        return None
    x = [f"stage {r.get('stage')}" for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for phase in ("fill", "steady", "drain"):
        fig.add_trace(
            go.Bar(
                x=x,
                y=[_num(r.get(f"{phase}_s")) for r in rows],
                name=f"bubble: {phase}",
                marker_color=PHASE_COLORS[phase],
                hovertemplate="%{x}<br>" + phase + ": %{y:.6f} s<extra></extra>",
            ),
            secondary_y=False,
        )
    inflight = [r.get("max_inflight_microbatches") for r in rows]
    if any(v is not None for v in inflight):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=inflight,
                mode="markers+lines",
                name="max in-flight microbatches",
                marker=dict(size=10, color="#333"),
                line=dict(dash="dot"),
            ),
            secondary_y=True,
        )
    versions = [r.get("weight_versions") for r in rows]
    if any(v is not None for v in versions):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=versions,
                mode="markers",
                name="weight versions",
                marker=dict(size=10, symbol="diamond", color="#7f3c8d"),
            ),
            secondary_y=True,
        )
    fig.update_yaxes(title_text="bubble seconds", secondary_y=False)
    fig.update_yaxes(title_text="count", secondary_y=True, rangemode="tozero", dtick=1)
    return _layout(fig, "bubbles per stage and in-flight microbatches", barmode="stack")


# ---------------------------------------------------------------- overlap (ZeRO-3 / FSDP)

_OP_TITLES = {
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_reduce": "all-reduce",
}


def overlap_layers(summary: dict, units: pl.DataFrame | None = None) -> go.Figure | None:
    """Per layer unit and phase: hidden (under compute) vs exposed seconds, per collective op."""
    ov = summary.get("overlap")
    if not ov:
        return None
    rows = list(ov.get("per_layer") or [])
    if not rows and units is not None and units.height:
        rows = (
            units.group_by("unit", "phase", "op", maintain_order=True)
            .agg(pl.col("duration_s").sum(), pl.col("hidden_s").sum(), pl.col("exposed_s").sum())
            .to_dicts()
        )
    if not rows:
        return None
    ops = list(dict.fromkeys(str(r.get("op")) for r in rows))
    ops.sort(key=lambda o: (["all_gather", "reduce_scatter"] + ops).index(o))
    frac = {
        "all_gather": (ov.get("allgather_s"), ov.get("allgather_hidden_fraction")),
        "reduce_scatter": (ov.get("reducescatter_s"), ov.get("reducescatter_hidden_fraction")),
    }
    titles = []
    for op in ops:
        total, hidden = frac.get(op, (None, None))
        name = _OP_TITLES.get(op, plain(op))
        titles.append(
            f"{name}: {fmt_frac(hidden)} hidden of {fmt_s(total)}" if total is not None else name
        )
    fig = make_subplots(
        rows=1, cols=len(ops), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.06
    )
    for i, op in enumerate(ops, start=1):
        sel = [r for r in rows if str(r.get("op")) == op]
        x = [plain(f"{r.get('unit')} · {r.get('phase')}") for r in sel]
        for part, color, label in (
            ("hidden_s", STATE_COLORS["overlap"], "hidden (under compute)"),
            ("exposed_s", STATE_COLORS["comm"], "exposed"),
        ):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=[_num(r.get(part)) for r in sel],
                    name=label,
                    marker_color=color,
                    legendgroup=part,
                    showlegend=i == 1,
                    hovertemplate="%{x}<br>" + label + ": %{y:.6f} s<extra></extra>",
                ),
                row=1,
                col=i,
            )
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    return _layout(
        fig,
        "collectives per layer unit: hidden under compute vs exposed",
        height=460,
        barmode="stack",
    )


# ---------------------------------------------------------------- memory


def memory(summary: dict) -> go.Figure | None:
    """Per rank: params / grads / optimizer / activation peak stacked, measured peak, theory line."""
    mem = summary.get("memory")
    rows = (mem or {}).get("per_rank") or []
    if not rows:
        return None
    peak = max(
        [sum(_num(r.get(k)) for k, _, _ in MEMORY_PARTS) for r in rows]
        + [_num(r.get("peak_bytes")) for r in rows]
        + [_num(((mem or {}).get("theory") or {}).get("model_states_bytes"))]
    )
    div, unit = _byte_unit(peak)
    x = [f"rank {r.get('rank')}" for r in rows]
    fig = go.Figure()
    for key, label, color in MEMORY_PARTS:
        fig.add_trace(
            go.Bar(
                x=x,
                y=[_num(r.get(key)) / div for r in rows],
                name=label,
                marker_color=color,
                hovertemplate="%{x}<br>" + label + ": %{y:.3f} " + unit + "<extra></extra>",
            )
        )
    peaks = [r.get("peak_bytes") for r in rows]
    if any(v is not None for v in peaks):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[None if v is None else v / div for v in peaks],
                mode="markers",
                name="measured peak",
                marker=dict(symbol="diamond", size=11, color="#222"),
                hovertemplate="%{x}<br>peak %{y:.3f} " + unit + "<extra></extra>",
            )
        )
    theory = (mem or {}).get("theory")
    if theory and theory.get("model_states_bytes") is not None:
        y = _num(theory["model_states_bytes"]) / div
        formula = plain(theory.get("formula", ""))
        fig.add_hline(y=y, line=dict(color="#d62728", dash="dash", width=2))
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                name="theory: model states",
                line=dict(color="#d62728", dash="dash", width=2),
                hoverinfo="skip",
            )
        )
        fig.add_annotation(
            text=f"theory {formula} = {plain(fmt_bytes(theory['model_states_bytes']))}",
            x=1,
            xref="paper",
            y=y,
            yref="y",
            showarrow=False,
            xanchor="right",
            yshift=10,
            font=dict(color="#d62728"),
        )
    return _layout(
        fig,
        "memory per rank: model states (params + grads + optimizer) and activation peak",
        barmode="stack",
        yaxis_title=unit,
    )


# ---------------------------------------------------------------- traffic and collectives


def traffic_split(summary: dict) -> go.Figure | None:
    """Bytes per op on intra-node vs inter-node links."""
    tr = summary.get("traffic")
    if not tr:
        return None
    by_op = tr.get("by_op") or []
    x = [plain(r.get("op") or "unknown") for r in by_op] + ["total"]
    intra = [_num(r.get("intra")) for r in by_op] + [_num(tr.get("intra_node_bytes"))]
    inter = [_num(r.get("inter")) for r in by_op] + [_num(tr.get("inter_node_bytes"))]
    div, unit = _byte_unit(max([a + b for a, b in zip(intra, inter)] + [1]))
    fig = go.Figure()
    for name, vals in (("intra", intra), ("inter", inter)):
        fig.add_trace(
            go.Bar(
                x=x,
                y=[v / div for v in vals],
                name=f"{name}-node links",
                marker_color=LINK_COLORS[name],
                hovertemplate="%{x}<br>" + name + "-node: %{y:.3f} " + unit + "<extra></extra>",
            )
        )
    title = (
        f"traffic on links: {fmt_frac(tr.get('inter_node_fraction'))} of "
        f"{fmt_bytes(tr.get('total_bytes'))} crosses nodes"
    )
    return _layout(fig, title, barmode="stack", yaxis_title=unit)


def _node_boundaries(summary: dict, ranks: Sequence[int]) -> list[float]:
    nodes = (summary.get("topology") or {}).get("nodes") or {}
    seq = [nodes.get(str(r), nodes.get(r)) for r in ranks]
    return [i - 0.5 for i in range(1, len(seq)) if seq[i] != seq[i - 1]]


def traffic_matrix(summary: dict) -> go.Figure | None:
    """Directed rank x rank bytes (matrix[src][dst]) with node boundaries drawn."""
    tr = summary.get("traffic")
    matrix = (tr or {}).get("matrix")
    if not matrix:
        return None
    z = np.asarray([[_num(v) for v in row] for row in matrix], dtype=np.float64)
    n = z.shape[0]
    # row/column i is rank matrix_ranks[i] (the ranks with traces or links; 0..n-1 when all are)
    ranks = list((tr or {}).get("matrix_ranks") or range(n))
    div, unit = _byte_unit(float(z.max()) if z.size else 1.0)
    fig = go.Figure(
        go.Heatmap(
            z=z / div,
            x=np.arange(z.shape[1]),
            y=np.arange(n),
            customdata=[[[ranks[i], ranks[j]] for j in range(n)] for i in range(n)],
            colorscale="Blues",
            colorbar=dict(title=dict(text=unit)),
            hovertemplate="rank %{customdata[0]} → rank %{customdata[1]}<br>%{z:.3f} "
            + unit
            + "<extra></extra>",
        )
    )
    for b in _node_boundaries(summary, ranks):
        fig.add_shape(
            type="line", x0=b, x1=b, y0=-0.5, y1=n - 0.5, line=dict(color="#e45756", width=2)
        )
        fig.add_shape(
            type="line", y0=b, y1=b, x0=-0.5, x1=n - 0.5, line=dict(color="#e45756", width=2)
        )
    at = list(range(0, n, max(1, math.ceil(n / 32))))
    ticks = dict(tickmode="array", tickvals=at, ticktext=[str(ranks[i]) for i in at])
    return _layout(
        fig,
        "bytes from rank (row) to rank (column); red lines: node boundaries",
        height=int(min(900, max(460, 140 + 18 * n))),
        xaxis=dict(title="destination rank", **ticks, constrain="domain"),
        yaxis=dict(title="source rank", autorange="reversed", scaleanchor="x", **ticks),
    )


def collective_bandwidth(summary: dict) -> go.Figure | None:
    """algbw and busbw per op (GB/s, nccl-tests definitions), and busbw per process group."""
    co = summary.get("collectives")
    per_op = (co or {}).get("per_op") or []
    if not per_op:
        return None
    per_group = co.get("per_group") or []
    cols = 2 if per_group else 1
    fig = make_subplots(
        rows=1,
        cols=cols,
        subplot_titles=["per op"] + (["busbw per process group"] if per_group else []),
    )
    x = [plain(r.get("op") or "unknown") for r in per_op]
    for key, name, color in (
        ("algbw_gbps", "algbw", "#9ecae1"),
        ("busbw_gbps", "busbw", "#3182bd"),
    ):
        fig.add_trace(
            go.Bar(
                x=x,
                y=[r.get(key) for r in per_op],
                name=name,
                marker_color=color,
                hovertemplate="%{x}<br>" + name + " %{y:.3f} GB/s<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if per_group:
        gx = [plain(f"{row_label(r)} · {r.get('op') or 'unknown'}") for r in per_group]
        fig.add_trace(
            go.Bar(
                x=gx,
                y=[r.get("busbw_gbps") for r in per_group],
                name="busbw per group",
                marker_color="#08519c",
                showlegend=False,
                hovertemplate="%{x}<br>busbw %{y:.3f} GB/s<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(title_text="GB/s", row=1, col=1)
    if not any(_num(r.get("busbw_gbps")) or _num(r.get("algbw_gbps")) for r in per_op):
        unknown = sum(int(_num(r.get("unknown_size"))) for r in per_op)
        fig.add_annotation(
            text=f"no bandwidth: the sizes of {unknown or 'these'} calls are unknown in this trace",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
            font=dict(size=14, color="#777"),
        )
    return _layout(
        fig, "collective bandwidth (GB/s = 10^9 B/s; busbw = algbw x bus factor)", barmode="group"
    )


def collective_time(summary: dict) -> go.Figure | None:
    """Per op: transfer vs synchronisation wait (or the plain duration when peers are missing)."""
    co = summary.get("collectives")
    per_op = (co or {}).get("per_op") or []
    if not per_op:
        return None
    x = [plain(r.get("op") or "unknown") for r in per_op]
    transfer = [r.get("transfer_s") for r in per_op]
    wait = [r.get("wait_s") for r in per_op]
    unknown = [(_num(r.get("time_s")) if r.get("transfer_s") is None else 0.0) for r in per_op]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=[_num(v) for v in transfer],
            name="transfer",
            marker_color="#3182bd",
            hovertemplate="%{x}<br>transfer %{y:.6f} s<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=x,
            y=[_num(v) for v in wait],
            name="wait for peers",
            marker_color="#fd8d3c",
            hovertemplate="%{x}<br>wait %{y:.6f} s<extra></extra>",
        )
    )
    if any(unknown):
        fig.add_trace(
            go.Bar(
                x=x,
                y=unknown,
                name="duration (split unknown: peers missing)",
                marker_color="#bdbdbd",
                hovertemplate="%{x}<br>duration %{y:.6f} s<extra></extra>",
            )
        )
    return _layout(
        fig,
        "collective time: transfer vs synchronisation wait (summed over calls and ranks)",
        barmode="stack",
        yaxis_title="seconds",
    )


# ---------------------------------------------------------------- comparison of runs

Run = tuple[str, dict]


def _mean(values: list) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _median(values: list) -> float | None:
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _max_known(values: Iterable[Any]) -> float | None:
    known = [_num(v) for v in values if v is not None]
    return max(known) if known else None


def compare_rows(runs: Sequence[Run]) -> list[dict]:
    """One row per run: the numbers the comparison shows (also the CLI's and Markdown's table)."""
    out = []
    for name, s in runs:
        ranks = s.get("ranks") or []
        mem = (s.get("memory") or {}).get("per_rank") or []
        co = s.get("collectives") or {}
        tr = s.get("traffic") or {}
        pipe = s.get("pipeline") or {}
        ov = s.get("overlap") or {}
        run = s.get("run") or {}
        out.append(
            {
                "run": name,
                "strategy": run.get("strategy"),
                "ranks": len(ranks),
                "step_time_s": _median([r.get("step_time_s") for r in ranks]),
                "span_s": _mean([r.get("span_s") for r in ranks]),
                "compute_s": _mean(
                    [_num(r.get("compute_s")) - _num(r.get("overlap_s")) for r in ranks]
                ),
                "compute_total_s": _mean([r.get("compute_s") for r in ranks]),
                "overlap_s": _mean([r.get("overlap_s") for r in ranks]),
                "exposed_comm_s": _mean([r.get("exposed_comm_s") for r in ranks]),
                "other_s": _mean([r.get("other_s") for r in ranks]),
                "idle_s": _mean([r.get("idle_s") for r in ranks]),
                # the largest known value; null (shown "–") when no rank knows it, never 0
                "params_bytes": _max_known(m.get("params_bytes") for m in mem),
                "grads_bytes": _max_known(m.get("grads_bytes") for m in mem),
                "optimizer_bytes": _max_known(m.get("optimizer_bytes") for m in mem),
                "model_states_bytes": _max_known(m.get("model_states_bytes") for m in mem),
                "peak_bytes": _max_known(m.get("peak_bytes") for m in mem),
                # payload S of every rank's row, summed over ranks (collectives rank_bytes)
                "collective_bytes": co.get("bytes"),
                # bytes on the wire, all links, whole window (traffic total_bytes)
                "wire_bytes": tr.get("total_bytes"),
                "ideal_bytes_per_rank": co.get("ideal_bytes_per_rank"),
                "intra_node_bytes": tr.get("intra_node_bytes"),
                "inter_node_bytes": tr.get("inter_node_bytes"),
                "bubble_fraction": pipe.get("bubble_fraction"),
                "allgather_hidden_fraction": ov.get("allgather_hidden_fraction"),
            }
        )
    return out


def compare_step_time(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not rows:
        return None
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=[r["step_time_s"] for r in rows],
            name="step time (median)",
            marker_color="#4c78a8",
            hovertemplate="%{x}<br>step %{y:.6f} s<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=x,
            y=[r["span_s"] for r in rows],
            name="window span (mean of ranks)",
            marker_color="#9ecae1",
            hovertemplate="%{x}<br>span %{y:.6f} s<extra></extra>",
        )
    )
    return _layout(fig, "step time per run", barmode="group", yaxis_title="seconds")


def compare_breakdown(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not rows:
        return None
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    for state, key in (
        ("compute", "compute_s"),
        ("overlap", "overlap_s"),
        ("comm", "exposed_comm_s"),
        ("other", "other_s"),
        ("idle", "idle_s"),
    ):
        fig.add_trace(
            go.Bar(
                x=x,
                y=[100 * _num(r[key]) / r["span_s"] if r["span_s"] else 0 for r in rows],
                name=STATE_LABELS[state],
                marker_color=STATE_COLORS[state],
                hovertemplate="%{x}<br>"
                + STATE_LABELS[state]
                + ": %{y:.1f}% of the span<extra></extra>",
            )
        )
    return _layout(
        fig,
        "where the time goes (mean over ranks, % of the window)",
        barmode="stack",
        yaxis_title="% of span",
    )


def compare_memory(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not any(r["model_states_bytes"] is not None for r in rows):
        return None
    peak = max(_num(r["peak_bytes"]) + _num(r["model_states_bytes"]) for r in rows)
    div, unit = _byte_unit(peak)
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    for key, label, color in MEMORY_PARTS[:3]:
        fig.add_trace(
            go.Bar(
                x=x,
                y=[_num(r[key]) / div for r in rows],
                name=label,
                marker_color=color,
                hovertemplate="%{x}<br>" + label + " %{y:.3f} " + unit + "<extra></extra>",
            )
        )
    theory = []
    for _, s in runs:
        t = (s.get("memory") or {}).get("theory") or {}
        theory.append(
            None if t.get("model_states_bytes") is None else _num(t["model_states_bytes"]) / div
        )
    if any(t is not None for t in theory):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=theory,
                mode="markers",
                name="theory: model states",
                marker=dict(symbol="line-ew-open", size=30, color="#d62728", line=dict(width=3)),
            )
        )
    return _layout(
        fig, "model states per rank (largest rank of each run)", barmode="stack", yaxis_title=unit
    )


def compare_bytes(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not rows:
        return None
    keys = (
        ("collective_bytes", "payload bytes, summed over ranks", "#4c78a8"),
        ("ideal_bytes_per_rank", "ideal bytes per rank (S x bus factor)", "#9ecae1"),
        ("intra_node_bytes", "intra-node wire bytes", "#54a24b"),
        ("inter_node_bytes", "inter-node wire bytes", "#e45756"),
    )
    peak = max([_num(r[k]) for r in rows for k, _, _ in keys] + [1])
    div, unit = _byte_unit(peak)
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    for key, label, color in keys:
        if all(r[key] is None for r in rows):
            continue
        fig.add_trace(
            go.Bar(
                x=x,
                y=[None if r[key] is None else _num(r[key]) / div for r in rows],
                name=label,
                marker_color=color,
                hovertemplate="%{x}<br>" + label + " %{y:.3f} " + unit + "<extra></extra>",
            )
        )
    return _layout(fig, "bytes communicated per run", barmode="group", yaxis_title=unit)


COMPARE_FIGURES = {
    "compare_step_time": compare_step_time,
    "compare_breakdown": compare_breakdown,
    "compare_memory": compare_memory,
    "compare_bytes": compare_bytes,
}


def compare_figures(runs: Sequence[Run]) -> dict[str, go.Figure | None]:
    return {name: fn(runs) for name, fn in COMPARE_FIGURES.items()}


# ---------------------------------------------------------------- everything for one analysis

#: Each figure of one analysis, by name: built one at a time where a page shows only some
#: (the Dash app), all together by :func:`figures_for` (reports).
FIGURES: dict[str, Callable[[Any], go.Figure | None]] = {
    "breakdown": lambda a: breakdown(a.summary),
    "timeline": lambda a: timeline_overview(frame(a, "timeline"), bubbles=frame(a, "bubbles")),
    "pipeline": lambda a: pipeline_schedule(
        a.summary, frame(a, "pipeline_ops"), frame(a, "bubbles"), frame(a, "pipeline_replay")
    ),
    "pipeline_stages": lambda a: pipeline_stages(a.summary),
    "overlap": lambda a: overlap_layers(a.summary, frame(a, "overlap_units")),
    "memory": lambda a: memory(a.summary),
    "traffic_split": lambda a: traffic_split(a.summary),
    "traffic_matrix": lambda a: traffic_matrix(a.summary),
    "collective_bandwidth": lambda a: collective_bandwidth(a.summary),
    "collective_time": lambda a: collective_time(a.summary),
}


def figures_for(analysis: Any) -> dict[str, go.Figure | None]:
    """Every figure of one analysis by name (None where the run has no such data)."""
    return {name: build(analysis) for name, build in FIGURES.items()}
