"""The predicted step time against inter-node bandwidth (tracekit predict's sweep) as a figure.

One curve per run (log bandwidth, step time of the slowest rank), the run's measured step as a
point at its own bandwidth (the emulated rate, or the busbw it achieved unshaped), the step
with free communication as a dashed line and the knee (docs/predict.md) marked on each curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from tracekit import prediction as P
from tracekit.figures.style import BASE_LAYOUT

DEFAULT_SWEEP = "100mbit:100gbit"
NO_DATA = "this run has no matched collective or p2p calls to predict from"
_COLORS = ("#4c78a8", "#e45756", "#54a24b", "#b279a2", "#f58518", "#72b7b2")


def predict_curve(preds: Sequence[tuple[str, dict[str, Any]]]) -> go.Figure | None:
    """Curves of the predictions that have a sweep; None when none has."""
    preds = [(n, p) for n, p in preds if p and p.get("sweep")]
    if not preds:
        return None
    fmt = P.fmt_rate
    fig = go.Figure()
    for i, (name, p) in enumerate(preds):
        color = _COLORS[i % len(_COLORS)]
        pts = p["sweep"]["points"]
        x = [q["inter_node_bits_per_s"] for q in pts]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[q["step_time_s"] for q in pts],
                mode="lines+markers",
                name=f"{name}: predicted",
                line=dict(color=color),
                hovertemplate="%{x:.3s}bit/s: %{y:.3f} s<extra></extra>",
            )
        )
        free = p.get("free_step_time_s")
        if free is not None:
            fig.add_trace(
                go.Scatter(
                    x=[x[0], x[-1]],
                    y=[free, free],
                    mode="lines",
                    name=f"{name}: free communication",
                    line=dict(color=color, dash="dot", width=1),
                )
            )
        mp = p["sweep"].get("measured_point") or {}
        if mp.get("inter_node_bits_per_s") and mp.get("step_time_s") is not None:
            fig.add_trace(
                go.Scatter(
                    x=[mp["inter_node_bits_per_s"]],
                    y=[mp["step_time_s"]],
                    mode="markers",
                    name=f"{name}: measured ({mp.get('label') or fmt(mp['inter_node_bits_per_s'])})",
                    marker=dict(color=color, symbol="diamond", size=12, line=dict(width=1)),
                )
            )
        knee = p["sweep"].get("knee_bits_per_s")
        if knee:
            fig.add_vline(x=knee, line=dict(color=color, dash="dash", width=1))
            fig.add_annotation(  # on a log axis an annotation's x is log10 of the value
                x=math.log10(knee),
                y=1 - 0.08 * i,
                yref="paper",
                text=f"knee {fmt(knee)}",
                showarrow=False,
                xanchor="left",
                font=dict(color=color),
            )
    fig.update_layout(
        template="plotly_white",
        title="predicted step time against inter-node bandwidth (slowest rank, median step)",
        xaxis=dict(type="log", title="inter-node bandwidth (bit/s per node and direction)"),
        yaxis=dict(title="step time (s)", rangemode="tozero"),
        height=420,
        margin=BASE_LAYOUT["margin"],
        legend=BASE_LAYOUT["legend"],
    )
    return fig


def sweep_for(analysis: Any) -> dict[str, Any] | None:
    """The run's prediction with a sweep: RUN/analysis/prediction.json when it has one, else
    the default sweep computed here (nothing written). None when the run has no matched calls."""
    from tracekit import guarded_read
    from tracekit.errors import TracekitError

    try:
        saved = P.default_output(Path(analysis.path))
        if saved.is_file():
            pred = guarded_read.load_json(saved)
            if isinstance(pred, dict) and pred.get("sweep"):
                return pred
    except (OSError, ValueError, TracekitError):
        pass  # no saved prediction (or an analysis held in memory only): compute one
    try:
        m = P.build(analysis)
        return P.prediction(m, P.parse_bandwidth(DEFAULT_SWEEP))
    except (TracekitError, ValueError):
        return None


def curve_for(analysis: Any) -> go.Figure | None:
    """The one-run figure (the Dash traffic page, reports): this run's sweep, the runs it was
    compared with and their crossovers."""
    pred = sweep_for(analysis)
    if not pred:
        return None
    others = [(c["name"], c) for c in pred.get("compared") or [] if c.get("sweep")]
    fig = predict_curve([(Path(analysis.path).name, pred), *others])
    if fig is None:  # not reached: pred has a sweep
        return None
    # e.g. one node: a flat curve says nothing. Inside the plot, low, on a white box: above
    # the plot it ran into the title
    for k, w in enumerate(pred.get("warnings") or []):
        fig.add_annotation(
            x=0.5,
            y=0.04 + 0.14 * k,
            xref="paper",
            yref="paper",
            text=w.replace("; ", ";<br>"),
            showarrow=False,
            yanchor="bottom",
            bgcolor="rgba(255,255,255,0.9)",
            font=dict(color="#b00"),
        )
    for c in pred.get("crossovers") or []:
        for x in c.get("crossover_bits_per_s") or []:
            fig.add_vline(x=x, line=dict(color="#555", dash="dot", width=1))
            fig.add_annotation(
                x=math.log10(x),
                y=0.02,
                yref="paper",
                text=f"crossover {P.fmt_rate(x)}",
                showarrow=False,
                xanchor="left",
            )
    return fig
