"""The memory page: model states and activation peak per rank against the theory."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from tracekit.figures.style import MEMORY_PARTS, bar, byte_unit, fmt_bytes, layout, num, plain
from tracekit.summary import Summary
from tracekit.summary.memory import MemoryRank


def _parts(r: MemoryRank) -> list[float]:
    """The bytes of :data:`MEMORY_PARTS`, in its order (unknown as 0)."""
    return [
        num(v) for v in (r.params_bytes, r.grads_bytes, r.optimizer_bytes, r.activation_peak_bytes)
    ]


def memory(summary: Summary) -> go.Figure | None:
    """Per rank: params / grads / optimizer stacked, activation peak and measured peak as
    markers, theory line."""
    rows = summary.memory.per_rank if summary.memory else []
    if not rows:
        return None
    theory = summary.memory.theory if summary.memory else None
    theory_bytes = theory.model_states_bytes if theory else None
    parts = [_parts(r) for r in rows]
    peak = max([sum(p) for p in parts] + [num(r.peak_bytes) for r in rows] + [num(theory_bytes)])
    div, unit = byte_unit(peak)
    x = [f"rank {r.rank}" for r in rows]
    fig = go.Figure()
    # model states stack (they are all held at once); the activation peak is a marker, not a
    # fourth block: it comes when not all grads / optimizer states are held, so a stack of
    # all four would stand above the measured peak
    for i, (_key, label, color) in enumerate(MEMORY_PARTS[:3]):
        fig.add_trace(
            bar(x, [p[i] / div for p in parts], label, color, label + ": %{y:.3f} " + unit)
        )
    _key, label, color = MEMORY_PARTS[3]
    acts = [r.activation_peak_bytes for r in rows]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[None if v is None else num(v) / div for v in acts],
            mode="markers",
            name=label,
            marker=dict(symbol="line-ew-open", size=40, color=color, line=dict(width=4)),
            hovertemplate="%{x}<br>" + label + ": %{y:.3f} " + unit + "<extra></extra>",
        )
    )
    peaks = [r.peak_bytes for r in rows]
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
    if theory is not None and theory_bytes is not None:
        y = num(theory_bytes) / div
        formula = plain(theory.formula)
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
            text=f"theory {formula} = {plain(fmt_bytes(theory_bytes))}",
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
        "memory per rank: model states stacked (params + grads + optimizer), activation peak "
        "and measured peak as markers",
        barmode="stack",
        yaxis_title=unit,
    )


def memory_of(analysis: Any) -> go.Figure | None:
    """The ``memory`` figure of an Analysis: bytes per rank beside the formula."""
    return memory(analysis.summary)
