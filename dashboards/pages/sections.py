"""A page of sections (tracekit.analyses.manifest ``PAGES``): for each, its figures and its table.

    /pipeline   the pipeline schedule (F/B/W, bubbles, replay, theory), bubbles per stage
    /overlap    all-gather / reduce-scatter hidden vs exposed per layer, and memory per rank
    /traffic    intra- vs inter-node bytes, the rank x rank matrix, the collectives, and
                tracekit predict's curve (what if the network were slower)
    /why        wait states, root causes and the critical path; CPU contention (can the run's
                own timings be trusted)

Each section shows its figures (``fig-<name>``; a figure the run has no data for: its sentence)
and its table; a section without any of its figures says so in one sentence. A page of several
sections heads each with its title. A new analysis shown in the app needs no code here: its
record on a page of the manifest.
"""

from __future__ import annotations

from collections.abc import Callable

from dash import html

from dashboards.pages.common import View, figure, graph, nodata, run_header, table_if
from dashboards.runs import Entry
from tracekit.analyses import manifest
from tracekit.report.tables import table_of


def graph_id(name: str) -> str:
    """The Dash id of figure NAME: ``fig-pipeline-stages``."""
    return "fig-" + name.replace("_", "-")


def section(entry: Entry, s: manifest.Section) -> list:
    """One section of the run: its figures (or each one's sentence) and its table, or one
    sentence when the run has none of its figures."""
    figs = [(f, figure(entry, f.name)) for f in s.figures]
    if figs and all(fig is None for _, fig in figs):
        return [nodata(s.figures[0].no_data)]
    kids = [
        graph(fig, graph_id(f.name)) if fig is not None else nodata(f.no_data) for f, fig in figs
    ]
    table = table_of(s)
    rows = table(entry.analysis.summary) if table else None
    if not figs and rows is None and s.no_data:  # a table-only section without data
        return [nodata(s.no_data)]
    return kids + table_if(rows)


def builder(page: manifest.Page) -> Callable[[View], list]:
    """The ``page(view)`` of a page of sections."""

    def build(view: View) -> list:
        kids: list = [run_header(view)]
        for s in page.sections:
            if len(page.sections) > 1:
                kids.append(html.H3(s.title))
            kids += section(view.run, s)
        return kids

    return build
