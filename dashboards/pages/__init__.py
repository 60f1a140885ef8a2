"""The app's pages (``PAGES``, in the order of the navigation bar).

    /           the runs under ROOT, a sortable table (dashboards.index); for the chosen run:
                per-rank table, time per rank, collectives and the top events
    /timeline   per-rank lanes (binned overview); zooming returns real bars for the window
    ...         the pages of sections, tracekit.analyses.manifest ``PAGES`` (dashboards.pages.
                sections): /pipeline, /overlap (and memory), /traffic (and collectives, predict)
    /compare    several runs side by side (``?run=a&run=b``)

A page of sections needs no code of its own: its figures and tables are its sections' records.
A page with a layout or callbacks of its own is a module here with ``page(view) -> list``
(dashboards.pages.common: figures through ``figure``/``fig_or_nodata``, tables from
tracekit.report) and, if it needs them, ``callbacks(app, runs, summaries)``, and a ``Page(...)``
line below; dashboards.app routes to it, links it in the navigation bar and gives it the run
dropdown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dash import Dash

from dashboards.index import Summaries
from dashboards.pages import compare, home, sections, timeline
from dashboards.pages.common import View
from dashboards.runs import Runs
from tracekit.analyses import manifest


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
    *(Page(p.path, p.label, sections.builder(p)) for p in manifest.PAGES),
    Page("/compare", "compare", compare.page, without_run=True, many=True),
]
