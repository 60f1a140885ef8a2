"""The collectives page: bandwidth per op and process group, and time as transfer vs wait."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tracekit.analyses.group_names import row_label
from tracekit.figures.read import num, op_label, section_rows
from tracekit.figures.style import bar, layout, plain


def collective_bandwidth(summary: dict[str, Any]) -> go.Figure | None:
    """algbw and busbw per op (GB/s, nccl-tests definitions), and busbw per process group."""
    per_op = section_rows(summary, "collectives", "per_op")
    if not per_op:
        return None
    per_group = section_rows(summary, "collectives", "per_group")
    cols = 2 if per_group else 1
    fig = make_subplots(
        rows=1,
        cols=cols,
        subplot_titles=["per op"] + (["busbw per process group"] if per_group else []),
    )
    x = [plain(op_label(r)) for r in per_op]
    for key, name, color in (
        ("algbw_gbps", "algbw", "#9ecae1"),
        ("busbw_gbps", "busbw", "#3182bd"),
    ):
        hover = name + " %{y:.3f} GB/s"
        fig.add_trace(bar(x, [r.get(key) for r in per_op], name, color, hover), row=1, col=1)
    if per_group:
        gx = [plain(f"{row_label(r)} · {op_label(r)}") for r in per_group]
        fig.add_trace(
            bar(
                gx,
                [r.get("busbw_gbps") for r in per_group],
                "busbw per group",
                "#08519c",
                "busbw %{y:.3f} GB/s",
                showlegend=False,
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(title_text="GB/s", row=1, col=1)
    if not any(num(r.get("busbw_gbps")) or num(r.get("algbw_gbps")) for r in per_op):
        unknown = sum(int(num(r.get("unknown_size"))) for r in per_op)
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


def collective_time(summary: dict[str, Any]) -> go.Figure | None:
    """Per op: transfer vs synchronisation wait (or the plain duration when peers are missing)."""
    per_op = section_rows(summary, "collectives", "per_op")
    if not per_op:
        return None
    x = [plain(op_label(r)) for r in per_op]
    # the split is unknown where peers are missing: those calls show their plain duration
    unknown = [(num(r.get("time_s")) if r.get("transfer_s") is None else 0.0) for r in per_op]
    parts = [
        ("transfer_s", "transfer", "#3182bd", "transfer"),
        ("wait_s", "wait for peers", "#fd8d3c", "wait"),
    ]
    fig = go.Figure()
    for key, name, color, short in parts:
        values = [num(r.get(key)) for r in per_op]
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
