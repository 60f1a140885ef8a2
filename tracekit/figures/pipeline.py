"""The pipeline page: the schedule (stage x time, F/B/W per microbatch, bubbles, the replay) and
the bubbles per stage."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from tracekit.figures.read import frame
from tracekit.figures.style import (
    KIND_COLORS,
    KIND_LABELS,
    PHASE_COLORS,
    bar,
    column,
    fmt_frac,
    layout,
    num,
    plain,
    span_seconds,
    spans,
)
from tracekit.summary import Summary
from tracekit.summary.pipeline import Pipeline

MAX_OPS = 6000  # pipeline ops drawn


def pipeline_theory_text(p: Pipeline) -> str:
    """The bubble fraction, measured and in theory, in one line (``p``: the pipeline section)."""
    stages, m = p.stages, p.microbatches
    parts = [f"measured {fmt_frac(p.bubble_fraction)} (pipeline windows)"]
    if p.bubble_fraction_span is not None:
        parts.append(f"whole span {fmt_frac(p.bubble_fraction_span)}")
    parts.append(f"replay {fmt_frac(p.bubble_fraction_replay)}")
    parts.append(
        f"theory (p-1)/(m+p-1) {fmt_frac(p.bubble_fraction_theory)}"
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
    """F/B/W ops as bars labelled with their microbatch; times in ``*_ns`` or ``*_s`` columns."""
    for kind in ("F", "B", "W"):
        k = ops.filter(pl.col("kind") == kind)
        if k.height == 0:
            continue
        if time_unit == "ns":
            start, dur = span_seconds(k, t0)
        else:
            start = k["start_s"].to_numpy() - t0
            dur = k["end_s"].to_numpy() - k["start_s"].to_numpy()
        y = np.array([lanes[key] for key in k.select(key_cols).rows()], dtype=np.float64)
        mb = column(k, "microbatch", -1)
        custom = np.column_stack(
            [
                column(k, "stage", -1),
                mb,
                column(k, "step", -1),
                dur * 1e3,
                column(k, "version", np.nan),
            ]
        )
        fig.add_trace(
            spans(
                start,
                dur,
                y,
                0.7,
                KIND_LABELS[kind],
                marker=dict(color=KIND_COLORS[kind], line=dict(width=0.5, color="white")),
                text=[str(int(v)) for v in mb],
                textposition="inside",
                insidetextanchor="middle",
                textfont=dict(color="white", size=10),
                constraintext="inside",
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


def _bubble_bars(
    fig: go.Figure,
    bubbles: pl.DataFrame | None,
    key_cols: list[str],
    lanes: dict[tuple, int],
    t0: int,
) -> None:
    """Bubbles (fill / steady / drain) as hatched bars behind the ops of their lane."""
    if bubbles is None or not bubbles.height or not all(c in bubbles.columns for c in key_cols):
        return
    bub = bubbles.filter(pl.col("end_ns") > pl.col("start_ns"))
    for phase in ("fill", "steady", "drain"):
        b = bub.filter(pl.col("phase") == phase).head(MAX_OPS)
        ys = [lanes.get(k) for k in b.select(key_cols).rows()]
        b = b.filter(pl.Series([y is not None for y in ys], dtype=pl.Boolean))
        if b.height == 0:
            continue
        start, dur = span_seconds(b, t0)
        fig.add_trace(
            spans(
                start,
                dur,
                np.array([y for y in ys if y is not None], dtype=np.float64),
                0.9,
                f"bubble: {phase}",
                marker=dict(
                    color=PHASE_COLORS[phase],
                    opacity=0.35,
                    line=dict(width=0),
                    pattern=dict(shape="/", fgcolor=PHASE_COLORS[phase], fgopacity=0.6),
                ),
                legendgroup=f"bubble-{phase}",
                customdata=np.column_stack([column(b, "step", -1), dur * 1e3]),
                hovertemplate=(
                    f"bubble ({phase})<br>step %{{customdata[0]}} · %{{customdata[1]:.3f}} ms"
                    "<extra></extra>"
                ),
            ),
            row=1,
            col=1,
        )


def pipeline_schedule(
    summary: Summary,
    ops: pl.DataFrame | None,
    bubbles: pl.DataFrame | None = None,
    replay: pl.DataFrame | None = None,
) -> go.Figure | None:
    """Stage x time: F/B/W per microbatch, bubbles (fill/steady/drain), and the replayed schedule."""
    p = summary.pipeline
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
    t0 = int(cast(int, ops["start_ns"].min()))
    _bubble_bars(fig, bubbles, key_cols, lanes, t0)
    _ops_bars(fig, ops, key_cols, lanes, t0, time_unit="ns", row=1, showlegend=True)
    n = len(keys)
    if replay is not None and has_replay:
        stages = sorted(int(s) for s in replay["stage"].unique().to_list())
        _ops_bars(
            fig,
            replay,
            ["stage"],
            {(s,): i for i, s in enumerate(stages)},
            float(cast(float, replay["start_s"].min())),
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
        f"pipeline schedule: {plain(p.schedule)}, {p.stages} stages, "
        f"{p.microbatches} microbatches" + (f" (first {MAX_OPS:,} ops)" if cut else "")
    )
    layout(fig, title, height=int(min(1100, 300 + 46 * n)), barmode="overlay")
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


def pipeline_stages(summary: Summary) -> go.Figure | None:
    """Per stage: fill / steady / drain bubble seconds, and in-flight microbatches."""
    per_stage = summary.pipeline.per_stage if summary.pipeline else []
    if not per_stage:
        return None
    x = [f"stage {r.stage}" for r in per_stage]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for phase, seconds in (
        ("fill", [num(r.fill_s) for r in per_stage]),
        ("steady", [num(r.steady_s) for r in per_stage]),
        ("drain", [num(r.drain_s) for r in per_stage]),
    ):
        fig.add_trace(
            bar(
                x,
                seconds,
                f"bubble: {phase}",
                PHASE_COLORS[phase],
                phase + ": %{y:.6f} s",
            ),
            secondary_y=False,
        )
    counts: tuple[tuple[list[int | None], dict[str, Any]], ...] = (
        (
            [r.max_inflight_microbatches for r in per_stage],
            dict(
                mode="markers+lines",
                name="max in-flight microbatches",
                marker=dict(size=10, color="#333"),
                line=dict(dash="dot"),
            ),
        ),
        (
            [r.weight_versions for r in per_stage],
            dict(
                mode="markers",
                name="weight versions",
                marker=dict(size=10, symbol="diamond", color="#7f3c8d"),
            ),
        ),
    )
    for y, look in counts:
        if any(v is not None for v in y):
            fig.add_trace(go.Scatter(x=x, y=y, **look), secondary_y=True)
    fig.update_yaxes(title_text="bubble seconds", secondary_y=False)
    fig.update_yaxes(title_text="count", secondary_y=True, rangemode="tozero", dtick=1)
    return layout(fig, "bubbles per stage and in-flight microbatches", barmode="stack")


def schedule_of(analysis: Any) -> go.Figure | None:
    """The ``pipeline`` figure of an Analysis: its schedule, bubbles and replay."""
    return pipeline_schedule(
        analysis.summary,
        frame(analysis, "pipeline_ops"),
        frame(analysis, "bubbles"),
        frame(analysis, "pipeline_replay"),
    )


def stages_of(analysis: Any) -> go.Figure | None:
    """The ``pipeline_stages`` figure of an Analysis: bubbles per stage."""
    return pipeline_stages(analysis.summary)
