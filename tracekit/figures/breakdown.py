"""The per-rank breakdown (the overview page): where each rank's window went, by state."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from tracekit.figures.style import STATE_COLORS, STATE_LABELS, bar, layout, num
from tracekit.summary import Summary


def breakdown(summary: Summary) -> go.Figure | None:
    """Per rank: compute, overlap, exposed comm, other, idle stacked to the span (seconds).
    Where the wait states are known (summary.json ``why``), exposed comm is split into its
    transfer and the waiting on peers (``why.wait_states.per_rank[]``): waiting for a peer is
    not moving bytes."""
    rows = summary.ranks
    if not rows:
        return None
    x = [f"rank {r.rank}" for r in rows]
    parts = {
        "compute": [num(r.compute_s) - num(r.overlap_s) for r in rows],
        "overlap": [num(r.overlap_s) for r in rows],
        **_exposed(summary),
        "other": [num(r.other_s) for r in rows],
        "idle": [num(r.idle_s) for r in rows],
    }
    fig = go.Figure()
    for state, values in parts.items():
        label = STATE_LABELS[state]
        fig.add_trace(bar(x, values, label, STATE_COLORS[state], label + ": %{y:.6f} s"))
    win = summary.window
    return layout(
        fig,
        f"time per rank over the window ({win.kind}, {win.steps} steps)",
        barmode="stack",
        yaxis_title="seconds",
    )


def breakdown_of(analysis: Any) -> go.Figure | None:
    """The ``breakdown`` figure of an Analysis (tracekit.analyses.manifest)."""
    return breakdown(analysis.summary)


def _exposed(summary: Summary) -> dict[str, list[float]]:
    """Exposed communication: as one state, or as transfer + waiting when every rank has both."""
    rows = summary.ranks
    waits = {w.rank: w for w in (summary.why.wait_states.per_rank if summary.why else [])}
    if not all(r.rank in waits for r in rows):
        return {"comm": [num(r.exposed_comm_s) for r in rows]}
    return {
        "transfer": [num(waits[r.rank].transfer_s) for r in rows],
        "waiting": [num(waits[r.rank].waiting_s) for r in rows],
    }
