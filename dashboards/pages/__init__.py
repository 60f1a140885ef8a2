"""The app's pages, one registry line each (``PAGES``, in the order of the navigation bar).

    /           the runs under ROOT, a sortable table (dashboards.index); for the chosen run:
                per-rank table, time per rank, collectives and the top events
    /timeline   per-rank lanes (binned overview); zooming returns real bars for the window
    /pipeline   the pipeline schedule (F/B/W, bubbles, replay, theory) and bubbles per stage
    /overlap    all-gather / reduce-scatter hidden vs exposed per layer, and memory per rank
    /traffic    intra- vs inter-node bytes, the rank x rank matrix, bandwidth, transfer vs wait
    /compare    several runs side by side (``?run=a&run=b``)

A page is a module here with ``page(view) -> list`` (dashboards.pages.common: its figures from
tracekit.figures.FIGURES through ``figure``/``fig_or_nodata``, its tables from tracekit.report)
and, if it has callbacks of its own, ``callbacks(app, runs, summaries)``. Adding a page for a
new analysis is that module and one ``Page(...)`` line below; dashboards.app routes to it, links
it in the navigation bar and gives it the run dropdown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dash import Dash

from dashboards.index import Summaries
from dashboards.pages import compare, home, overlap, pipeline, timeline, traffic
from dashboards.pages.common import View
from dashboards.runs import Runs


@dataclass(frozen=True)
class Page:
    """One page: its URL path, its label in the navigation bar, and what builds it."""

    path: str
    label: str
    build: Callable[[View], list]
    # without a run (no ?run=): the page itself (True), or "choose a run above" (False)
    without_run: bool = False
    # ?run= chooses several runs (a multi-select) instead of one (a dropdown)
    many: bool = False
    callbacks: Callable[[Dash, Runs, Summaries], None] | None = None


PAGES = [
    Page("/", "runs", home.page, without_run=True, callbacks=home.callbacks),
    Page("/timeline", "timeline", timeline.page, callbacks=timeline.callbacks),
    Page("/pipeline", "pipeline", pipeline.page),
    Page("/overlap", "overlap & memory", overlap.page),
    Page("/traffic", "traffic", traffic.page),
    Page("/compare", "compare", compare.page, without_run=True, many=True),
]
