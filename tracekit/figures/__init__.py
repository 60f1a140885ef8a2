"""Figures: plotly only, no Dash. Pure functions from an analysis' summary and frames to go.Figure.

The Dash app (dashboards/), the reports (tracekit.report) and ``Analysis.figure(name)`` all draw
these; nothing here knows about pages. A builder reads the typed summary's attributes
(``analysis.summary``, tracekit.summary.Summary) and frames, and returns ``None`` when its
section of the summary is null or its frame is absent; callers then show its plain sentence from
:data:`NO_DATA`.

One module per page: ``breakdown`` (overview), ``timeline`` (with ``lanes`` and ``binning``),
``pipeline``, ``overlap``, ``memory``, ``traffic``, ``collectives``, ``prediction``, and
``compare`` for several runs; ``style`` (colours, layout, text and numbers) and ``read`` (an
analysis' frames by name) serve them all. Which figures a run has, their builders
``(analysis) -> go.Figure | None`` and their no-data sentences are the sections' records
(tracekit.analyses.manifest); a new figure is a builder in its page's module and a
``Figure(...)`` in its section's record.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from tracekit.analyses import manifest
from tracekit.figures.compare import compare_figures, compare_rows
from tracekit.figures.lanes import timeline_lanes
from tracekit.figures.read import frame
from tracekit.figures.style import fmt_s
from tracekit.figures.timeline import MAX_BARS, timeline_detail, timeline_overview

Builder = Callable[[Any], go.Figure | None]


def builder(figure: manifest.Figure) -> Builder:
    """The builder a record names: ``"module:function"`` of this package."""
    module, function = figure.build.split(":")
    build: Builder = getattr(importlib.import_module(f"tracekit.figures.{module}"), function)
    return build


#: Each figure of one analysis, by name: built one at a time where a page shows only some
#: (the Dash app), all together by :func:`figures_for` (reports).
FIGURES: dict[str, Builder] = {name: builder(f) for name, f in manifest.figures().items()}

#: What a page or report says instead of a figure the run has no data for.
NO_DATA: dict[str, str] = {name: f.no_data for name, f in manifest.figures().items()}


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
