"""The why page: the timelines with the critical path drawn across ranks, and who waits on whom
(summary.json ``why``, tracekit.analyses.why)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import plotly.graph_objects as go
import polars as pl

from tracekit.analyses import intervals as iv
from tracekit.figures.read import frame
from tracekit.figures.style import STATE_COLORS, layout

# the states of the breakdown with waiting as its own state (tracekit.analyses.wait_states),
# in the colours the breakdown bars give them, so a state looks the same on every figure
_COLORS = {s: STATE_COLORS[s] for s in ("compute", "transfer", "waiting", "other")}
MAX_SEGMENTS = 20_000  # per state: beyond, the timeline would not draw in a browser


def matrix_of(analysis: Any) -> go.Figure | None:
    """``why_matrix``: seconds each rank (row) waited on each last-arriving rank (column)."""
    why = analysis.summary.why
    if why is None or not why.wait_states.pairs:
        return None
    ranks = sorted({r.rank for r in why.wait_states.per_rank})
    pos = {r: i for i, r in enumerate(ranks)}
    z = np.full((len(ranks), len(ranks)), np.nan)
    for p in why.wait_states.pairs:
        if p.waiter in pos and p.cause in pos:
            z[pos[p.waiter], pos[p.cause]] = p.wait_s
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"rank {r}" for r in ranks],
            y=[f"rank {r}" for r in ranks],
            colorscale="Reds",
            colorbar={"title": "s"},
            hovertemplate="%{y} waited %{z:.4g} s on %{x}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title="waiter")
    fig.update_xaxes(title="arrived last")
    return layout(fig, "who waits on whom (Scalasca wait states, seconds)")


def _lines(f: pl.DataFrame, t0: int, y: dict[int, int]) -> tuple[list[Any], list[Any]]:
    """Segments as one line trace: x start, end, None; y the rank's row."""
    f = f.head(MAX_SEGMENTS)
    xs = np.column_stack(
        [(f["start_ns"] - t0) * 1e-6, (f["end_ns"] - t0) * 1e-6, np.full(f.height, np.nan)]
    ).ravel()
    rows = np.array([y[int(r)] for r in f["rank"]], dtype=float)
    ys = np.column_stack([rows, rows, np.full(f.height, np.nan)]).ravel()
    return [None if np.isnan(v) else float(v) for v in xs], [
        None if np.isnan(v) else float(v) for v in ys
    ]


def _band(fig: go.Figure, state: str, spans: pl.DataFrame, t0: int, y: dict[int, int]) -> None:
    """One state's spans as thick horizontal lines on each rank's row."""
    x, yy = _lines(spans, t0, y)
    fig.add_trace(
        go.Scatter(x=x, y=yy, mode="lines", name=state, line={"color": _COLORS[state], "width": 14})
    )


def _split_exposed(exposed: pl.DataFrame, waits: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each rank's exposed communication (the timeline's ``comm`` state) inside its wait
    intervals (waiting on peers) and outside them (transfer), as WaitRank defines them."""
    wait_iv = waits.filter(pl.col("wait_ns") > 0).select(
        "rank", "start_ns", (pl.col("start_ns") + pl.col("wait_ns")).alias("end_ns")
    )
    parts: dict[str, list[pl.DataFrame]] = {"waiting": [], "transfer": []}
    for (rank,), e in exposed.partition_by("rank", as_dict=True).items():
        w = wait_iv.filter(pl.col("rank") == rank)
        a = iv.union(e["start_ns"].to_numpy(), e["end_ns"].to_numpy())
        b = iv.union(w["start_ns"].to_numpy(), w["end_ns"].to_numpy())
        for name, (s, t) in (("waiting", iv.intersect(a, b)), ("transfer", iv.minus(a, b))):
            parts[name].append(pl.DataFrame({"rank": [rank] * len(s), "start_ns": s, "end_ns": t}))
    empty = pl.DataFrame(schema={"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})

    def cat(frames: list[pl.DataFrame]) -> pl.DataFrame:
        return pl.concat(frames, how="vertical_relaxed") if frames else empty

    return cat(parts["waiting"]), cat(parts["transfer"])


def path_of(analysis: Any) -> go.Figure | None:
    """``why_path``: each rank's timeline (compute, transfer, waiting) and the critical path
    across ranks as a black line, hops between ranks drawn vertically."""
    why = analysis.summary.why
    path = frame(analysis, "critical_path")
    if why is None or path is None or path.height == 0:
        return None
    waits = frame(analysis, "wait_states")
    tl = analysis.timeline
    ranks = sorted(int(r) for r in tl["rank"].unique()) if tl.height else []
    y = {r: i for i, r in enumerate(ranks)}
    t0 = int(cast(int, path["start_ns"].min()))
    fig = go.Figure()
    busy = tl.filter(pl.col("state").is_in(["compute", "overlap"]))
    _band(fig, "compute", busy, t0, y)
    exposed = tl.filter(pl.col("state") == "comm")
    if waits is not None and waits.height:
        waited, moved = _split_exposed(exposed, waits)
        _band(fig, "waiting", waited, t0, y)
        _band(fig, "transfer", moved, t0, y)
    else:
        _band(fig, "transfer", exposed, t0, y)
    # the path: pieces in time order, joined (a hop is a vertical line at its time)
    p = path.filter(pl.col("rank").is_in(list(y))).sort("step", "start_ns")
    px: list[Any] = []
    py: list[Any] = []
    for row in p.iter_rows(named=True):
        px += [(row["start_ns"] - t0) * 1e-6, (row["end_ns"] - t0) * 1e-6]
        py += [y[row["rank"]] + 0.3, y[row["rank"]] + 0.3]
    fig.add_trace(
        go.Scatter(
            x=px, y=py, mode="lines", name="critical path", line={"color": "black", "width": 3}
        )
    )
    fig.update_yaxes(
        tickvals=list(y.values()), ticktext=[f"rank {r}" for r in y], autorange="reversed"
    )
    fig.update_xaxes(title="ms from the first step's start")
    return layout(
        fig, "timelines and the critical path across ranks", height=max(300, 90 * len(y) + 150)
    )
