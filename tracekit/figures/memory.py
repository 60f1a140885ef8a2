"""The memory page: model states and activation peak per rank against the theory."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from tracekit.figures.read import num, section, section_rows
from tracekit.figures.style import MEMORY_PARTS, bar, byte_unit, fmt_bytes, layout, plain


def memory(summary: dict[str, Any]) -> go.Figure | None:
    """Per rank: params / grads / optimizer / activation peak stacked, measured peak, theory line."""
    rows = section_rows(summary, "memory", "per_rank")
    if not rows:
        return None
    theory = section(section(summary, "memory"), "theory")
    peak = max(
        [sum(num(r.get(k)) for k, _, _ in MEMORY_PARTS) for r in rows]
        + [num(r.get("peak_bytes")) for r in rows]
        + [num(theory.get("model_states_bytes"))]
    )
    div, unit = byte_unit(peak)
    x = [f"rank {r.get('rank')}" for r in rows]
    fig = go.Figure()
    for key, label, color in MEMORY_PARTS:
        fig.add_trace(
            bar(
                x,
                [num(r.get(key)) / div for r in rows],
                label,
                color,
                label + ": %{y:.3f} " + unit,
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
    if theory.get("model_states_bytes") is not None:
        y = num(theory["model_states_bytes"]) / div
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
    return layout(
        fig,
        "memory per rank: model states (params + grads + optimizer) and activation peak",
        barmode="stack",
        yaxis_title=unit,
    )
