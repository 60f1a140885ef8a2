"""The per-rank breakdown (the overview page): where each rank's window went, by state."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from tracekit.figures.read import num, rank_rows, section
from tracekit.figures.style import STATE_COLORS, STATE_LABELS, bar, layout


def breakdown(summary: dict[str, Any]) -> go.Figure | None:
    """Per rank: compute, overlap, exposed comm, other, idle stacked to the span (seconds)."""
    rows = rank_rows(summary)
    if not rows:
        return None
    x = [f"rank {r['rank']}" for r in rows]
    parts = {
        "compute": [num(r.get("compute_s")) - num(r.get("overlap_s")) for r in rows],
        "overlap": [num(r.get("overlap_s")) for r in rows],
        "comm": [num(r.get("exposed_comm_s")) for r in rows],
        "other": [num(r.get("other_s")) for r in rows],
        "idle": [num(r.get("idle_s")) for r in rows],
    }
    fig = go.Figure()
    for state, values in parts.items():
        label = STATE_LABELS[state]
        fig.add_trace(bar(x, values, label, STATE_COLORS[state], label + ": %{y:.6f} s"))
    win = section(summary, "window")
    return layout(
        fig,
        f"time per rank over the window ({win.get('kind', '?')}, {win.get('steps', 0)} steps)",
        barmode="stack",
        yaxis_title="seconds",
    )
