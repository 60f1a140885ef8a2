"""``/``: the runs under ROOT (dashboards.index's sortable table, filled in as analyses come in)
and, for the chosen run, its per-rank table, time per rank, collectives and top events."""

from __future__ import annotations

from dash import Dash, Input, Output, html

from dashboards import index
from dashboards.pages.common import View, fig_or_nodata, nodata, run_header, table
from dashboards.runs import Runs
from tracekit import report as R


def page(view: View) -> list:
    listed = view.runs.list_runs()
    kids: list = []
    if not listed:
        kids.append(nodata("no run folders or trace folders under ROOT"))
    else:
        rows, pending = view.summaries.rows()
        kids.append(
            html.Details(
                [
                    html.Summary(f"{len(listed)} run{'' if len(listed) == 1 else 's'} under ROOT"),
                    index.table(rows, pending),
                ],
                open=view.entry is None,
            )
        )
    if view.entry is None:
        return kids
    entry = view.entry
    a = entry.analysis
    kids += [
        run_header(view),
        table(R.rank_table(a.summary), "rank-table"),
        fig_or_nodata(entry, "breakdown", "fig-breakdown"),
        table(R.collectives_table(a.summary)),
        table(entry.memoized("top_events", lambda: R.top_events(a.event_totals)), "top-events"),
    ]
    return kids


def callbacks(app: Dash, runs: Runs, summaries: index.Summaries) -> None:
    """The index table's poll: rows as their analyses come in, until none is pending."""

    @app.callback(
        Output("index-table", "data"),
        Output("index-poll", "disabled"),
        Input("index-poll", "n_intervals"),
        prevent_initial_call=True,
    )
    def poll_index(n: int | None):
        rows, pending = summaries.rows()
        return rows, not pending
