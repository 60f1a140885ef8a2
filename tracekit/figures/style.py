"""How every figure looks and says things: colours, labels, the common layout, text and numbers.

Trace strings (event names, layer units, run names) go into figures as data only: they pass
through :func:`plain`, which turns ``& < >`` into entities that plotly.js decodes back to text,
so plotly's pseudo-HTML (``<b>``, ``<a href>``) never sees a tag that came from a trace.
Unknown (null) values are shown as :data:`UNKNOWN`, never as 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl

NS = 1e-9
STATES = ("compute", "overlap", "comm", "other", "idle")
STATE_CODE = {s: i for i, s in enumerate(STATES)}
STATE_LABELS = {
    "compute": "compute",
    "overlap": "compute + comm (overlap)",
    "comm": "exposed comm",
    "transfer": "exposed transfer",
    "waiting": "waiting on peers",
    "other": "other (memcpy/memset/sync)",
    "idle": "idle",
}
STATE_COLORS = {
    "compute": "#2e8b3e",
    "overlap": "#1f9fb4",
    "comm": "#d62728",
    "transfer": "#d62728",
    "waiting": "#ff9896",
    "other": "#8c6bb1",
    "idle": "#c8c8c8",
}
PHASE_COLORS = {"fill": "#17becf", "steady": "#f2b701", "drain": "#7f3c8d"}
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

UNKNOWN = "–"  # how every unknown (null) value is shown: never 0, never a guess

BASE_LAYOUT = dict(
    template="plotly_white",
    margin=dict(l=70, r=20, t=60, b=50),
    font=dict(size=12),
    legend=dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.01),
)


# ---------------------------------------------------------------- text


def plain(text: Any) -> str:
    """Trace text as plotly shows it literally: ``& < >`` as entities (plotly.js decodes them)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plain_expr(expr: pl.Expr) -> pl.Expr:
    """:func:`plain` on a polars string column (null as the empty string)."""
    return (
        expr.cast(pl.Utf8)
        .fill_null("")
        .str.replace_all("&", "&amp;", literal=True)
        .str.replace_all("<", "&lt;", literal=True)
        .str.replace_all(">", "&gt;", literal=True)
    )


def num(x: Any) -> float:
    """A value to draw: a number, with null / NaN / non-numbers as 0 (tables show them "–")."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


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


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """The divisor and name of the unit for values up to ``max_bytes`` (decimal, as the tables
    and GB/s use)."""
    for div, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if max_bytes >= div:
            return div, name
    return 1.0, "B"


# ---------------------------------------------------------------- layout and traces


def mix(color: str, other: str, t: float) -> str:
    """``color`` moved the fraction ``t`` of the way to ``other`` (both ``#rrggbb``)."""
    a = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))


def layout(fig: go.Figure, title: str, height: int = 420, **kw: Any) -> go.Figure:
    """The common look (:data:`BASE_LAYOUT`), a left-aligned title, and ``kw`` on top."""
    fig.update_layout(**BASE_LAYOUT)
    fig.update_layout(
        title=dict(text=title, x=0, xanchor="left", font=dict(size=15)), height=height, **kw
    )
    return fig


def bar(x: Sequence[Any], y: Sequence[Any], name: str, color: str, hover: str, **kw: Any) -> go.Bar:
    """A vertical bar trace; ``hover`` is its tooltip after the x label."""
    return go.Bar(
        x=x,
        y=y,
        name=name,
        marker_color=color,
        hovertemplate="%{x}<br>" + hover + "<extra></extra>",
        **kw,
    )


def spans(
    start: Any,
    dur: Any,
    y: Any,
    width: float,
    name: str,
    color: str | None = None,
    *,
    marker: dict[str, Any] | None = None,
    **kw: Any,
) -> go.Bar:
    """Time spans as horizontal bars from ``start`` lasting ``dur`` (seconds) at lanes ``y``;
    borderless in ``color`` unless ``marker`` says otherwise.

    Bars beat layout shapes by far in Chromium: every shape is its own SVG node and relayout
    redraws them all.
    """
    return go.Bar(
        orientation="h",
        base=start,
        x=dur,
        y=y,
        width=width,
        marker=marker if marker is not None else dict(color=color, line=dict(width=0)),
        name=name,
        **kw,
    )


def span_seconds(f: pl.DataFrame, t0_ns: int | float) -> tuple[np.ndarray, np.ndarray]:
    """Start (seconds since ``t0_ns``) and duration (seconds) of the spans of ``f``."""
    return (f["start_ns"] - t0_ns).to_numpy() * NS, (f["end_ns"] - f["start_ns"]).to_numpy() * NS


def column(f: pl.DataFrame, name: str, fill: int | float) -> np.ndarray:
    """A column as numbers for hover data, null as ``fill``; all ``fill`` where ``f`` lacks it."""
    if name not in f.columns:
        return np.full(f.height, fill)
    s = f[name].cast(pl.Float64) if isinstance(fill, float) else f[name]
    return s.fill_null(fill).to_numpy()
