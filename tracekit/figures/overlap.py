"""The overlap page (ZeRO-3 / FSDP / HSDP): how much of each layer unit's all-gather and
reduce-scatter ran under compute."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from tracekit.figures.read import num, section, section_rows
from tracekit.figures.style import STATE_COLORS, bar, fmt_frac, fmt_s, layout, plain

_OP_TITLES = {
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_reduce": "all-reduce",
}


def overlap_layers(summary: dict[str, Any], units: pl.DataFrame | None = None) -> go.Figure | None:
    """Per layer unit and phase: hidden (under compute) vs exposed seconds, per collective op."""
    ov = section(summary, "overlap")
    if not ov:
        return None
    rows = list(section_rows(summary, "overlap", "per_layer"))
    if not rows and units is not None and units.height:
        rows = (
            units.group_by("unit", "phase", "op", maintain_order=True)
            .agg(pl.col("duration_s").sum(), pl.col("hidden_s").sum(), pl.col("exposed_s").sum())
            .to_dicts()
        )
    if not rows:
        return None
    ops = list(dict.fromkeys(str(r.get("op")) for r in rows))
    ops.sort(key=lambda o: (["all_gather", "reduce_scatter"] + ops).index(o))
    frac = {
        "all_gather": (ov.get("allgather_s"), ov.get("allgather_hidden_fraction")),
        "reduce_scatter": (ov.get("reducescatter_s"), ov.get("reducescatter_hidden_fraction")),
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
        sel = [r for r in rows if str(r.get("op")) == op]
        x = [plain(f"{r.get('unit')} · {r.get('phase')}") for r in sel]
        for part, color, label in (
            ("hidden_s", STATE_COLORS["overlap"], "hidden (under compute)"),
            ("exposed_s", STATE_COLORS["comm"], "exposed"),
        ):
            fig.add_trace(
                bar(
                    x,
                    [num(r.get(part)) for r in sel],
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
