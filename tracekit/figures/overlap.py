"""The overlap page (ZeRO-3 / FSDP / HSDP): how much of each layer unit's all-gather and
reduce-scatter ran under compute."""

from __future__ import annotations

from typing import Any, NamedTuple

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from tracekit.figures.read import frame
from tracekit.figures.style import STATE_COLORS, bar, fmt_frac, fmt_s, layout, num, plain
from tracekit.summary import Summary

_OP_TITLES = {
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_reduce": "all-reduce",
}


class _Layer(NamedTuple):
    """One bar pair: a layer unit's phase of one op, from the summary or the frame."""

    unit: Any
    phase: Any
    op: Any
    hidden_s: float | None
    exposed_s: float | None


def overlap_layers(summary: Summary, units: pl.DataFrame | None = None) -> go.Figure | None:
    """Per layer unit and phase: hidden (under compute) vs exposed seconds, per collective op."""
    ov = summary.overlap
    if not ov:
        return None
    # the summary's per_layer rows, else the overlap_units frame summed the same way
    rows = [_Layer(r.unit, r.phase, r.op, r.hidden_s, r.exposed_s) for r in ov.per_layer]
    if not rows and units is not None and units.height:
        per = units.group_by("unit", "phase", "op", maintain_order=True).agg(
            pl.col("hidden_s").sum(), pl.col("exposed_s").sum()
        )
        rows = [_Layer(*r) for r in per.rows()]
    if not rows:
        return None
    ops = list(dict.fromkeys(str(r.op) for r in rows))
    ops.sort(key=lambda o: (["all_gather", "reduce_scatter"] + ops).index(o))
    frac = {
        "all_gather": (ov.allgather_s, ov.allgather_hidden_fraction),
        "reduce_scatter": (ov.reducescatter_s, ov.reducescatter_hidden_fraction),
    }
    titles = []
    for op in ops:
        total, hidden = frac.get(op, (None, None))
        name = _OP_TITLES.get(op, plain(op))
        titles.append(
            f"{name}: {fmt_frac(hidden)} hidden of {fmt_s(total)}" if total is not None else name
        )
    fig = make_subplots(
        rows=1, cols=len(ops), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.06
    )
    for i, op in enumerate(ops, start=1):
        sel = [r for r in rows if str(r.op) == op]
        x = [plain(f"{r.unit} · {r.phase}") for r in sel]
        for values, part, color, label in (
            (
                [num(r.hidden_s) for r in sel],
                "hidden_s",
                STATE_COLORS["overlap"],
                "hidden (under compute)",
            ),
            ([num(r.exposed_s) for r in sel], "exposed_s", STATE_COLORS["comm"], "exposed"),
        ):
            fig.add_trace(
                bar(
                    x,
                    values,
                    label,
                    color,
                    label + ": %{y:.6f} s",
                    legendgroup=part,
                    showlegend=i == 1,
                ),
                row=1,
                col=i,
            )
    fig.update_yaxes(title_text="seconds", row=1, col=1)
    return layout(
        fig,
        "collectives per layer unit: hidden under compute vs exposed",
        height=460,
        barmode="stack",
    )


def overlap_of(analysis: Any) -> go.Figure | None:
    """The ``overlap`` figure of an Analysis: hidden and exposed transfer per layer."""
    return overlap_layers(analysis.summary, frame(analysis, "overlap_units"))
