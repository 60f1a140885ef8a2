"""The collectives page: bandwidth per op and process group, and time as transfer vs wait."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tracekit.figures.style import bar, layout, num, plain
from tracekit.summary import Summary


def collective_bandwidth(summary: Summary) -> go.Figure | None:
    """algbw and busbw per op (GB/s, nccl-tests definitions), and busbw per process group."""
    per_op = summary.collectives.per_op
    if not per_op:
        return None
    per_group = summary.collectives.per_group
    cols = 2 if per_group else 1
    fig = make_subplots(
        rows=1,
        cols=cols,
        subplot_titles=["per op"] + (["busbw per process group"] if per_group else []),
    )
    x = [plain(r.op or "unknown") for r in per_op]
    for values, name, color in (
        ([r.algbw_gbps for r in per_op], "algbw", "#9ecae1"),
        ([r.busbw_gbps for r in per_op], "busbw", "#3182bd"),
    ):
        hover = name + " %{y:.3f} GB/s"
        fig.add_trace(bar(x, values, name, color, hover), row=1, col=1)
    if per_group:
        gx = [plain(f"{r.label} · {r.op or 'unknown'}") for r in per_group]
        fig.add_trace(
            bar(
                gx,
                [r.busbw_gbps for r in per_group],
                "busbw per group",
                "#08519c",
                "busbw %{y:.3f} GB/s",
                showlegend=False,
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(title_text="GB/s", row=1, col=1)
    if not any(num(r.busbw_gbps) or num(r.algbw_gbps) for r in per_op):
        unknown = sum(r.unknown_size for r in per_op)
        fig.add_annotation(
            text=f"no bandwidth: the sizes of {unknown or 'these'} calls are unknown in this trace",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
            font=dict(size=14, color="#777"),
        )
    return layout(
        fig, "collective bandwidth (GB/s = 10^9 B/s; busbw = algbw x bus factor)", barmode="group"
    )


def collective_time(summary: Summary) -> go.Figure | None:
    """Per op: transfer vs synchronisation wait (or the plain duration when peers are missing)."""
    per_op = summary.collectives.per_op
    if not per_op:
        return None
    x = [plain(r.op or "unknown") for r in per_op]
    # the split is unknown where peers are missing: those calls show their plain duration
    unknown = [(num(r.time_s) if r.transfer_s is None else 0.0) for r in per_op]
    parts = [
        ([num(r.transfer_s) for r in per_op], "transfer", "#3182bd", "transfer"),
        ([num(r.wait_s) for r in per_op], "wait for peers", "#fd8d3c", "wait"),
    ]
    fig = go.Figure()
    for values, name, color, short in parts:
        fig.add_trace(bar(x, values, name, color, short + " %{y:.6f} s"))
    if any(unknown):
        name = "duration (split unknown: peers missing)"
        fig.add_trace(bar(x, unknown, name, "#bdbdbd", "duration %{y:.6f} s"))
    return layout(
        fig,
        "collective time: transfer vs synchronisation wait (summed over calls and ranks)",
        barmode="stack",
        yaxis_title="seconds",
    )


def bandwidth_of(analysis: Any) -> go.Figure | None:
    """The ``collective_bandwidth`` figure of an Analysis."""
    return collective_bandwidth(analysis.summary)


def time_of(analysis: Any) -> go.Figure | None:
    """The ``collective_time`` figure of an Analysis."""
    return collective_time(analysis.summary)
