"""Figures: plotly only, no Dash. Pure functions from an analysis' summary and frames to go.Figure.

The Dash app (dashboards/) and the report (tracekit.report) both call these; nothing here knows
about pages. A builder reads the typed summary's attributes (tracekit.summary.Summary; an
Analysis' ``typed_summary``) and frames, and returns ``None`` when its section of the summary is
null or its frame is absent; callers then show its plain sentence from :data:`NO_DATA`.

One module per page: ``breakdown`` (overview), ``timeline`` (with ``lanes`` and ``binning``),
``pipeline``, ``overlap``, ``memory``, ``traffic``, ``collectives``, ``predict``, and
``compare`` for several runs; ``style`` (colours, layout, text and numbers) and ``read`` (an
analysis' frames by name) serve them all. A new figure is a builder in its page's module and
one line of :data:`_TABLE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from tracekit.figures.breakdown import breakdown
from tracekit.figures.collectives import collective_bandwidth, collective_time
from tracekit.figures.compare import compare_figures, compare_rows
from tracekit.figures.lanes import timeline_lanes
from tracekit.figures.memory import memory
from tracekit.figures.overlap import overlap_layers
from tracekit.figures.pipeline import pipeline_schedule, pipeline_stages
from tracekit.figures.read import frame
from tracekit.figures.style import fmt_s
from tracekit.figures.timeline import MAX_BARS, timeline_detail, timeline_overview
from tracekit.figures.traffic import traffic_matrix, traffic_split

Builder = Callable[[Any], go.Figure | None]

_NO_PIPELINE = "this run has no pipeline data"
_NO_TRAFFIC = "this run has no traffic data"
_NO_COLLECTIVES = "this run has no collectives data"

# name, builder from an Analysis, the sentence shown when the builder gives None
_TABLE: tuple[tuple[str, Builder, str], ...] = (
    ("breakdown", lambda a: breakdown(a.typed_summary), "this run has no per-rank data"),
    (
        "timeline",
        lambda a: timeline_overview(frame(a, "timeline"), bubbles=frame(a, "bubbles")),
        "this run has no timeline data",
    ),
    (
        "pipeline",
        lambda a: pipeline_schedule(
            a.typed_summary,
            frame(a, "pipeline_ops"),
            frame(a, "bubbles"),
            frame(a, "pipeline_replay"),
        ),
        _NO_PIPELINE,
    ),
    ("pipeline_stages", lambda a: pipeline_stages(a.typed_summary), _NO_PIPELINE),
    (
        "overlap",
        lambda a: overlap_layers(a.typed_summary, frame(a, "overlap_units")),
        "this run has no overlap data (ZeRO-3 / FSDP / HSDP runs have it)",
    ),
    ("memory", lambda a: memory(a.typed_summary), "this run has no memory data"),
    ("traffic_split", lambda a: traffic_split(a.typed_summary), _NO_TRAFFIC),
    ("traffic_matrix", lambda a: traffic_matrix(a.typed_summary), _NO_TRAFFIC),
    ("collective_bandwidth", lambda a: collective_bandwidth(a.typed_summary), _NO_COLLECTIVES),
    ("collective_time", lambda a: collective_time(a.typed_summary), _NO_COLLECTIVES),
)

#: Each figure of one analysis, by name: built one at a time where a page shows only some
#: (the Dash app), all together by :func:`figures_for` (reports).
FIGURES: dict[str, Builder] = {name: build for name, build, _ in _TABLE}

#: What a page or report says instead of a figure the run has no data for.
NO_DATA: dict[str, str] = {name: sentence for name, _, sentence in _TABLE}


def figures_for(analysis: Any) -> dict[str, go.Figure | None]:
    """Every figure of one analysis by name (None where the run has no such data)."""
    return {name: build(analysis) for name, build in FIGURES.items()}


__all__ = [
    "FIGURES",
    "MAX_BARS",
    "NO_DATA",
    "compare_figures",
    "compare_rows",
    "figures_for",
    "fmt_s",
    "frame",
    "timeline_detail",
    "timeline_lanes",
    "timeline_overview",
]
