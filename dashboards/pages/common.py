"""What every page builds with: the request a page answers, the components, the callback guard.

A page is a function ``page(view: View) -> list`` of Dash components. Its figures come from
tracekit.figures through ``figure(entry, name)`` (built once per run, on first use, and only
those the page shows), its tables from tracekit.report through ``table``. Trace strings are
only ever text components (React escapes them; no dangerously_allow_html anywhere).
"""

from __future__ import annotations

import functools
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dash import dcc, html

from dashboards.index import Summaries
from dashboards.runs import Entry, Runs
from tracekit import figures as F
from tracekit import report as R


@dataclass(frozen=True)
class View:
    """What a page is asked to show: ``?run=`` values, the first one's analysis if it has one."""

    runs: Runs
    summaries: Summaries
    chosen: list[str]
    rel: str | None = None
    entry: Entry | None = None

    @property
    def run(self) -> Entry:
        """The chosen run's entry (the router shows a page that needs a run only with one)."""
        if self.entry is None:
            raise LookupError("no run chosen")
        return self.entry


def figure(entry: Entry, name: str) -> Any:
    """The run's figure NAME (None where the run has no such data), built once, on first use: a
    page builds only the figures it shows (a first visit to /timeline of a big run waits for
    the timeline alone, not for every figure of the run)."""
    return entry.memoized(f"figure:{name}", lambda: F.FIGURES[name](entry.analysis))


def runs_from_search(search: str | None) -> list[str]:
    """The non-empty ``run`` values of a URL's query string, in order."""
    qs = urllib.parse.parse_qs((search or "").lstrip("?"), keep_blank_values=True)
    return [r for r in qs.get("run", []) if r != ""]


def search_for(runs: list[str]) -> str:
    """The query string choosing RUNS ("" for none)."""
    return "?" + urllib.parse.urlencode([("run", r) for r in runs]) if runs else ""


def table(t: R.Table, table_id: str | None = None) -> html.Div:
    """A tracekit.report table: its caption, then its rows, or "no rows"."""
    title, head, rows = t
    body = [html.Tr([html.Td(str(c)) for c in row]) for row in rows]
    kids: list[Any] = [html.Div(title, className="caption")]
    if rows:
        kids.append(
            html.Table(
                [html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)],
                id=table_id or "",
            )
        )
    else:
        kids.append(html.P("no rows", className="nodata"))
    return html.Div(kids, className="table-wrap")


def table_if(t: R.Table | None) -> list:
    """``[table(t)]`` for a table, ``[]`` where the run has none (a report table builder's None)."""
    return [table(t)] if t else []


def graph(fig: Any, graph_id: str) -> Any:
    """A figure as a dcc.Graph of the figure's own height, with its own loading spinner."""
    height = int(fig.layout.height or 420)
    return dcc.Loading(
        dcc.Graph(
            id=graph_id, figure=fig, style={"height": f"{height}px"}, config={"displaylogo": False}
        ),
        type="default",
    )


def nodata(text: str) -> html.P:
    return html.P(text, className="nodata")


def fig_or_nodata(entry: Entry, name: str, graph_id: str) -> Any:
    """The run's figure NAME as a graph, or the sentence of tracekit.figures.NO_DATA."""
    fig = figure(entry, name)
    return graph(fig, graph_id) if fig is not None else nodata(F.NO_DATA[name])


def run_header(view: View) -> html.Div:
    """The run's name, its strategy, backend, precision, ranks and window, and its warnings."""
    s = view.run.analysis.summary
    run, win = s.run, s.window
    bits = [f"{len(s.ranks)} ranks", f"window: {win.kind}, {win.steps} steps"]
    if run:

        def v(x: Any) -> str:  # unknown (a tracekit.profile run's strategy): "–", never "None"
            return "–" if x is None else str(x)

        bits = [
            f"strategy {v(run.strategy)}",
            f"{v(run.backend)} / {v(run.device)}",
            f"precision {v(run.precision)}",
        ] + bits
    kids = [html.H2(view.rel), html.P(" · ".join(str(b) for b in bits), className="src")]
    for w in s.warnings:
        kids.append(html.P(f"warning: {w}", className="warn"))
    return html.Div(kids)


def guarded(fallback: Callable[[str], Any]) -> Callable[[Callable], Callable]:
    """A callback that never answers HTTP 500: an error that is not TracekitError (a bug, a
    crafted request) becomes ``fallback(one line)`` for the page, and one line on stderr."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded(*args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - shown as one line, never a traceback
                line = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                print(f"tracekit dash: {fn.__name__}: {line}", file=sys.stderr)
                return fallback(line)

        return guarded

    return wrap
