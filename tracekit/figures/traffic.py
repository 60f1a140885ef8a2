"""The traffic page: bytes on intra- vs inter-node links, and the rank x rank matrix."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from tracekit.figures.style import (
    LINK_COLORS,
    bar,
    byte_unit,
    fmt_bytes,
    fmt_frac,
    layout,
    num,
    plain,
)
from tracekit.summary import Summary


def traffic_split(summary: Summary) -> go.Figure | None:
    """Bytes per op on intra-node vs inter-node links."""
    tr = summary.traffic
    if not tr:
        return None
    by_op = tr.by_op
    x = [plain(r.op or "unknown") for r in by_op] + ["total"]
    intra = [num(r.intra) for r in by_op] + [num(tr.intra_node_bytes)]
    inter = [num(r.inter) for r in by_op] + [num(tr.inter_node_bytes)]
    div, unit = byte_unit(max([a + b for a, b in zip(intra, inter)] + [1]))
    fig = go.Figure()
    for name, vals in (("intra", intra), ("inter", inter)):
        fig.add_trace(
            bar(
                x,
                [v / div for v in vals],
                f"{name}-node links",
                LINK_COLORS[name],
                name + "-node: %{y:.3f} " + unit,
            )
        )
    title = (
        f"traffic on links: {fmt_frac(tr.inter_node_fraction)} of "
        f"{fmt_bytes(tr.total_bytes)} crosses nodes"
    )
    return layout(fig, title, barmode="stack", yaxis_title=unit)


def _node_boundaries(summary: Summary, ranks: Sequence[int]) -> list[float]:
    nodes = summary.topology.nodes  # rank (a JSON key: text) -> node
    seq = [nodes.get(str(r)) for r in ranks]
    return [i - 0.5 for i in range(1, len(seq)) if seq[i] != seq[i - 1]]


def traffic_matrix(summary: Summary) -> go.Figure | None:
    """Directed rank x rank bytes (matrix[src][dst]) with node boundaries drawn."""
    tr = summary.traffic
    if tr is None or not tr.matrix:
        return None
    matrix = tr.matrix
    z = np.asarray([[num(v) for v in row] for row in matrix], dtype=np.float64)
    n = z.shape[0]
    # row/column i is rank matrix_ranks[i] (the ranks with traces or links; 0..n-1 when all are)
    ranks = tr.matrix_ranks or list(range(n))
    div, unit = byte_unit(float(z.max()) if z.size else 1.0)
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
    boundary = dict(type="line", line=dict(color="#e45756", width=2))
    for b in _node_boundaries(summary, ranks):
        fig.add_shape(x0=b, x1=b, y0=-0.5, y1=n - 0.5, **boundary)
        fig.add_shape(y0=b, y1=b, x0=-0.5, x1=n - 0.5, **boundary)
    at = list(range(0, n, max(1, math.ceil(n / 32))))
    ticks = dict(tickmode="array", tickvals=at, ticktext=[str(ranks[i]) for i in at])
    return layout(
        fig,
        "bytes from rank (row) to rank (column); red lines: node boundaries",
        height=int(min(900, max(460, 140 + 18 * n))),
        xaxis=dict(title="destination rank", **ticks, constrain="domain"),
        yaxis=dict(title="source rank", autorange="reversed", scaleanchor="x", **ticks),
    )


def split_of(analysis: Any) -> go.Figure | None:
    """The ``traffic_split`` figure of an Analysis: intra- versus inter-node bytes per op."""
    return traffic_split(analysis.summary)


def matrix_of(analysis: Any) -> go.Figure | None:
    """The ``traffic_matrix`` figure of an Analysis: bytes rank x rank."""
    return traffic_matrix(analysis.summary)
