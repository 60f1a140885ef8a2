"""The tracekit Dash app: builds the app and wires its parts; every figure comes from tracekit.figures.

``create_app(root)`` serves the run folders and trace folders under ROOT:

- dashboards.root: which runs are listed, which ``?run=`` is refused, where the app listens
  (127.0.0.1 unless told; nothing outside ROOT is ever shown or served);
- dashboards.runs: the listing refreshed and the analyses cached (a few runs, keyed by path and
  the files' mtimes; a run's figures built on first use, each once);
- dashboards.pool: analyses in bounded pools, each failed after ``analysis_timeout`` seconds,
  so one run whose read never returns blocks neither the index nor its own page request;
- dashboards.pages: the pages, one registry line each; dashboards.index: the runs table of ``/``;
- dashboards.plotly_js: the plotly.js bundle served, preloaded and started early;
- dashboards.guard: a malformed callback request answered 4xx in one line, never a traceback.

The run is chosen by ``?run=<path relative to ROOT>``; the dropdown rewrites the URL, so every
view can be bookmarked. The routing callback below shows the page of the URL's path for the
run(s) of its query: a refused ``?run=`` as its plain message, an analysis error as "could not
analyse this run: ...", any other error as "could not show this run: <one line>" (never an
HTTP 500, never a traceback).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboards import guard, index, plotly_js
from dashboards.pages import PAGES
from dashboards.pages.common import View, guarded, nodata, runs_from_search, search_for
from dashboards.pages.timeline import warm
from dashboards.root import DEFAULT_HOST, Refused, host_warning
from dashboards.runs import ANALYSIS_TIMEOUT_S, CACHE_SIZE, Runs
from tracekit.errors import TracekitError


def _nav(search: str) -> list:
    return [dcc.Link(p.label, href=p.path + search, className="nav-link") for p in PAGES]


def _run_picker(runs: list[str], value: Any, multi: bool = False) -> html.Div:
    return html.Div(
        [
            html.Label(
                "runs" if multi else "run", htmlFor="compare-select" if multi else "run-select"
            ),
            dcc.Dropdown(
                id="compare-select" if multi else "run-select",
                options=[{"label": r, "value": r} for r in runs],
                value=value,
                multi=multi,
                placeholder="choose runs to compare" if multi else "choose a run",
                clearable=multi,
                style={"minWidth": "420px"},
            ),
        ],
        className="picker",
    )


class TracekitApp(Dash):
    """A Dash app that also holds the runs it serves (for tests and embedding)."""

    tracekit_runs: Runs
    tracekit_summaries: index.Summaries


def create_app(
    root: Path | str,
    *,
    analyses: Mapping[str, Any] | None = None,
    cache_size: int = CACHE_SIZE,
    analysis_timeout: float = ANALYSIS_TIMEOUT_S,
) -> TracekitApp:
    """The Dash app over the runs under ROOT.

    ``analyses`` adds ready-made analyses under the given names (e.g. synthetic runs); they are
    listed and chosen like runs on disk. ``cache_size``: analyses kept in memory (LRU).
    ``analysis_timeout``: seconds after which a run's analysis is failed, saying so
    (dashboards.pool), so that a page request always answers.
    """
    root = Path(root)
    if not root.is_dir():
        raise TracekitError("no such folder", root)
    runs = Runs(
        root, preloaded=analyses, cache_size=cache_size, analysis_timeout_s=analysis_timeout
    )
    by_path = {p.path: p for p in PAGES}
    summaries = index.Summaries(runs)
    app = TracekitApp(
        __name__,
        title="tracekit",
        update_title=None,  # type: ignore[arg-type]  # dash types it str; its docs: None disables it
        suppress_callback_exceptions=True,
        assets_folder=str(Path(__file__).with_name("assets")),
        serve_locally=True,
    )
    guard.install(app)  # a malformed callback request: a 4xx and one line, never a 500
    app.tracekit_runs = runs  # for tests and embedding
    app.tracekit_summaries = summaries
    plotly_js.install(app)
    warm()
    app.layout = html.Div(
        [
            dcc.Location(id="url", refresh=False),
            html.Header(
                [html.Span("tracekit", className="brand"), html.Nav(id="nav", children=_nav(""))]
            ),
            html.Div(id="controls"),
            # only the page callback drives this spinner; each figure has its own dcc.Loading
            dcc.Loading(
                html.Div(id="page"),
                type="circle",
                delay_show=150,
                # dash 4 generates TargetComponents as an empty TypedDict: no key type-checks
                target_components={"page": "children"},  # type: ignore[arg-type]
            ),
        ],
        className="app",
    )

    @app.callback(
        Output("nav", "children"),
        Output("controls", "children"),
        Output("page", "children"),
        Input("url", "pathname"),
        Input("url", "search"),
    )
    @guarded(
        lambda line: (
            no_update,
            no_update,
            [html.P(f"could not show this run: {line}", className="warn", id="page-error")],
        )
    )
    def render(pathname: str | None, search: str | None):
        pathname = pathname or "/"
        chosen = runs_from_search(search)
        listed = runs.list_runs()
        page = by_path.get(pathname)
        if page is None:
            return (
                _nav(search or ""),
                [],
                [nodata(f"no page {pathname!r}; pages: " + ", ".join(p.path for p in PAGES))],
            )
        if page.many:
            valid = []
            for c in chosen:
                try:
                    runs.resolve(c)
                    valid.append(c)
                except Refused:
                    pass
            options = listed + [c for c in valid if c not in listed]
            return (
                _nav(search or ""),
                _run_picker(options, valid, multi=True),
                page.build(View(runs, summaries, chosen)),
            )
        rel = chosen[0] if chosen else None
        nav = _nav(search_for([rel]) if rel else "")
        entry = None
        if rel is not None:
            try:
                entry = runs.entry(rel)
            except Refused as exc:
                # the picker shows no value: a refused string is never offered as a choice
                return (
                    nav,
                    _run_picker(listed, None),
                    [html.P(str(exc), className="refusal", id="refusal")],
                )
            except TracekitError as exc:
                return (
                    nav,
                    _run_picker(listed + ([rel] if rel not in listed else []), rel),
                    [html.P(f"could not analyse this run: {runs.message(exc)}", className="warn")],
                )
        controls = _run_picker(listed + ([rel] if rel and rel not in listed else []), rel)
        if entry is None and not page.without_run:
            return nav, controls, [nodata("choose a run above")]
        return nav, controls, page.build(View(runs, summaries, chosen, rel, entry))

    @app.callback(
        Output("url", "search"),
        Input("run-select", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def pick_run(value: str | None, search: str | None):
        new = search_for([value] if value else [])
        return no_update if new == (search or "") else new

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("compare-select", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def pick_runs(values: list[str] | None, search: str | None):
        new = search_for(list(values or []))
        return no_update if new == (search or "") else new

    for p in PAGES:
        if p.callbacks is not None:
            p.callbacks(app, runs, summaries)
    return app


def serve(
    root: Path | str,
    host: str = DEFAULT_HOST,
    port: int = 8050,
    analysis_timeout: float = ANALYSIS_TIMEOUT_S,
) -> None:
    """Run the app (blocking). Anything but localhost gets a warning on stderr."""
    warning = host_warning(host)
    if warning:
        print(warning, file=sys.stderr)
    app = create_app(root, analysis_timeout=analysis_timeout)
    print(
        f"tracekit dash: serving {Path(root).resolve()} on http://{host}:{port}/", file=sys.stderr
    )
    _quiet_server()
    app.run(host=host, port=port, debug=False)


def _quiet_server() -> None:
    """Keep Flask's red "development server" banner and werkzeug's line per request off the
    terminal: the app serves one user on loopback; our own line above says where it listens."""
    import logging

    import flask.cli

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    flask.cli.show_server_banner = lambda *args, **kwargs: None
