"""The tracekit Dash app: layout and callbacks only; every figure comes from tracekit.figures.

``create_app(root)`` serves the run folders and trace folders under ROOT:

    /           the runs under ROOT, a sortable table (dashboards.index); for the chosen run:
                per-rank table, time per rank, collectives and the top events
    /timeline   per-rank lanes (binned overview); zooming returns real bars for the window
    /pipeline   the pipeline schedule (F/B/W, bubbles, replay, theory) and bubbles per stage
    /overlap    all-gather / reduce-scatter hidden vs exposed per layer, and memory per rank
    /traffic    intra- vs inter-node bytes, the rank x rank matrix, bandwidth, transfer vs wait
    /compare    several runs side by side (``?run=a&run=b``)

The run is chosen by ``?run=<path relative to ROOT>``; the dropdown rewrites the URL, so every
view can be bookmarked. Safety: ``?run=`` is resolved against ROOT and refused (a plain
message, nothing of the target shown) when it is absolute, has ``..``, or leads out of ROOT
through a symlink, itself or anywhere inside the run. The app reads traces only through
tracekit.analyze, never serves files (Dash's own assets and plotly.js aside), never unpickles,
and shows trace strings as text components (React escapes them; no dangerously_allow_html
anywhere). Analyses are cached in memory, a few runs, keyed by path and the files' mtimes; a
run's figures are built on first use, each once.
"""

from __future__ import annotations

import functools
import html as html_text
import json
import math
import os
import sys
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import plotly.io as pio
import polars as pl
from dash import Dash, Input, Output, State, dcc, html, no_update
from flask import Response

from dashboards import index
from tracekit import figures as F
from tracekit import report as R
from tracekit import runfolder
from tracekit.errors import TracekitError

PAGES = [
    ("/", "runs"),
    ("/timeline", "timeline"),
    ("/pipeline", "pipeline"),
    ("/overlap", "overlap & memory"),
    ("/traffic", "traffic"),
    ("/compare", "compare"),
]
CACHE_SIZE = 4
MAX_LISTED = 500
MAX_DEPTH = 4
MAX_WALK = 20_000
SKIP_DIRS = {"analysis", "memory", "train", "nccl", "__pycache__", "node_modules"}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


class Refused(Exception):
    """A ?run= that is not a run under ROOT; str() is the plain message shown."""


# ---------------------------------------------------------------- runs under ROOT


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _has_traces(folder: Path, names: list[str]) -> bool:
    return any(
        runfolder.is_trace_file(folder / n) and n not in ("run.json", "summary.json") for n in names
    )


@dataclass
class _Entry:
    analysis: Any
    memo: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Runs:
    """The runs under ROOT, ?run= resolution, and the LRU cache of their analyses."""

    def __init__(
        self, root: Path, preloaded: Mapping[str, Any] | None = None, cache_size: int = CACHE_SIZE
    ):
        self.root = Path(root).resolve()
        self.preloaded = {str(k): _Entry(v) for k, v in (preloaded or {}).items()}
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.Lock] = {}
        self._listing: tuple[float, list[str]] | None = None

    # -- listing
    def list_runs(self) -> list[str]:
        """Run folders and trace folders under ROOT (relative, posix), refreshed every few seconds."""
        now = time.monotonic()
        if self._listing and now - self._listing[0] < 5:
            return self._listing[1]
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            here = Path(dirpath)
            rel = here.relative_to(self.root)
            if runfolder.is_run_folder(here) or _has_traces(here, filenames):
                if not here.is_symlink():
                    found.append(rel.as_posix())
                dirnames[:] = []
            else:
                depth = len(rel.parts)
                dirnames[:] = sorted(
                    d
                    for d in dirnames
                    if depth < MAX_DEPTH
                    and d not in SKIP_DIRS
                    and not d.startswith(".")
                    and not d.endswith(".analysis")
                    and not (here / d).is_symlink()
                )
            if len(found) >= MAX_LISTED:
                break
        runs = sorted(found) + sorted(self.preloaded)
        self._listing = (now, runs)
        return runs

    # -- ?run= resolution
    def resolve(self, rel: str) -> Path | str:
        """The run's resolved path (or a preloaded name); Refused when it is not one under ROOT."""
        refusal = Refused(
            f"refused: {rel!r} is not a run folder or trace folder inside this dashboard's root"
        )
        if not isinstance(rel, str) or not rel or len(rel) > 1000 or "\x00" in rel:
            raise refusal
        if rel in self.preloaded:
            return rel
        if (
            rel.startswith(("/", "\\", "~"))
            or PurePosixPath(rel).is_absolute()
            or PureWindowsPath(rel).is_absolute()
            or PureWindowsPath(rel).drive
        ):
            raise refusal
        if any(part == ".." for part in rel.replace("\\", "/").split("/")):
            raise refusal
        try:
            path = (self.root / rel).resolve(strict=True)
        except (OSError, RuntimeError):
            raise refusal from None
        if not _inside(path, self.root):
            raise refusal
        if path.is_dir():
            if not (runfolder.is_run_folder(path) or runfolder.find_trace_files(path)):
                raise refusal
            seen = 0
            for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
                for name in dirnames + filenames:
                    p = Path(dirpath) / name
                    seen += 1
                    if seen > MAX_WALK:
                        raise refusal
                    if p.is_symlink():
                        try:
                            target = p.resolve(strict=False)
                        except (OSError, RuntimeError):
                            raise refusal from None
                        if not _inside(target, self.root):
                            raise refusal
        elif not runfolder.is_trace_file(path):
            raise refusal
        return path

    # -- analyses
    def _signature(self, path: Path) -> tuple:
        files = runfolder.find_trace_files(path)
        extra = [runfolder.run_json_path(path)] if path.is_dir() else []
        sig = []
        for f in files + extra:
            try:
                st = f.stat()
            except OSError:
                continue
            sig.append((str(f), st.st_mtime_ns, st.st_size))
        return tuple(sig)

    def entry(self, rel: str) -> _Entry:
        """The cached analysis of ?run=REL (analysing it on first use); Refused / TracekitError."""
        path = self.resolve(rel)
        if isinstance(path, str):
            return self.preloaded[path]
        key = (str(path), self._signature(path))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            build = self._building.setdefault(key, threading.Lock())
        with build:  # one analysis per run at a time, however many callbacks ask
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    return hit
            from tracekit.analyze import analyze

            result = _Entry(analyze(path))
            with self._lock:
                for old in [k for k in self._cache if k[0] == key[0]]:
                    del self._cache[old]
                self._cache[key] = result
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
                self._building.pop(key, None)
            return result

    def cached(self, key: tuple) -> _Entry | None:
        """The analysis cached under (path, signature), if any; never starts one."""
        with self._lock:
            return self._cache.get(key)

    def message(self, exc: Exception) -> str:
        """An error as the page shows it: one line, ROOT's own location left out."""
        return str(exc).replace(str(self.root), "ROOT")


def _memo(entry: _Entry, name: str, build) -> Any:
    with entry.lock:
        if name not in entry.memo:
            entry.memo[name] = build()
        return entry.memo[name]


def _figure(entry: _Entry, name: str) -> Any:
    """The run's figure NAME (None where the run has no such data), built once, on first use: a
    page builds only the figures it shows (a first visit to /timeline of a big run waits for
    the timeline alone, not for every figure of the run)."""
    return _memo(entry, f"figure:{name}", lambda: F.FIGURES[name](entry.analysis))


# ---------------------------------------------------------------- small components


def _runs_from_search(search: str | None) -> list[str]:
    qs = urllib.parse.parse_qs((search or "").lstrip("?"), keep_blank_values=True)
    return [r for r in qs.get("run", []) if r != ""]


def _search_for(runs: list[str]) -> str:
    return "?" + urllib.parse.urlencode([("run", r) for r in runs]) if runs else ""


def _table(t: R.Table, table_id: str | None = None) -> html.Div:
    title, head, rows = t
    body = [html.Tr([html.Td(str(c)) for c in row]) for row in rows]
    kids = [html.Div(title, className="caption")]
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


def _graph(fig: Any, graph_id: str) -> Any:
    height = int(fig.layout.height or 420)
    return dcc.Loading(
        dcc.Graph(
            id=graph_id, figure=fig, style={"height": f"{height}px"}, config={"displaylogo": False}
        ),
        type="default",
    )


def _nodata(text: str) -> html.P:
    return html.P(text, className="nodata")


def _fig_or_nodata(fig: Any, name: str, graph_id: str) -> Any:
    return _graph(fig, graph_id) if fig is not None else _nodata(F.NO_DATA[name])


def _nav(search: str) -> list:
    return [dcc.Link(label, href=path + search, className="nav-link") for path, label in PAGES]


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


# ---------------------------------------------------------------- pages


def _run_header(rel: str, a: Any) -> html.Div:
    s = a.summary
    run = s.get("run") or {}
    win = s.get("window") or {}
    bits = [
        f"{len(s.get('ranks') or [])} ranks",
        f"window: {win.get('kind')}, {win.get('steps')} steps",
    ]
    if run:
        bits = [
            f"strategy {run.get('strategy')}",
            f"{run.get('backend')} / {run.get('device')}",
            f"{run.get('precision')}",
        ] + bits
    kids = [html.H2(rel), html.P(" · ".join(str(b) for b in bits), className="src")]
    for w in s.get("warnings") or []:
        kids.append(html.P(f"warning: {w}", className="warn"))
    return html.Div(kids)


def _page_index(
    runs: Runs, rel: str | None, entry: _Entry | None, summaries: index.Summaries
) -> list:
    listed = runs.list_runs()
    kids: list = []
    if not listed:
        kids.append(_nodata("no run folders or trace folders under ROOT"))
    else:
        # dashboards.index: a sortable table of every run, filled in as analyses come in
        rows, pending = summaries.rows()
        kids.append(
            html.Details(
                [html.Summary(f"{len(listed)} runs under ROOT"), index.table(rows, pending)],
                open=entry is None,
            )
        )
    if entry is None:
        return kids
    a = entry.analysis
    kids += [
        _run_header(rel, a),
        _table(R.rank_table(a.summary), "rank-table"),
        _fig_or_nodata(_figure(entry, "breakdown"), "breakdown", "fig-breakdown"),
        _table(R.collectives_table(a.summary)),
        _table(_memo(entry, "top_events", lambda: R.top_events(a.events)), "top-events"),
    ]
    return kids


def _page_timeline(rel: str, entry: _Entry) -> list:
    a = entry.analysis
    fig = _figure(entry, "timeline")
    if fig is None:
        return [_run_header(rel, a), _nodata(F.NO_DATA["timeline"])]
    meta = fig.layout.meta or {}
    info = (
        f"overview: {meta.get('segments', 0):,} spans in {meta.get('bins')} bins of "
        f"{F.fmt_s(meta.get('bin_s'))} per rank. Drag to zoom: real bars appear once the window "
        f"holds at most {F.MAX_BARS:,} spans; double-click to go back."
    )
    return [
        _run_header(rel, a),
        html.P(info, id="timeline-info", className="info"),
        dcc.Store(id="timeline-zoom"),
        _graph(fig, "timeline-graph"),
    ]


def _page_pipeline(rel: str, entry: _Entry) -> list:
    a = entry.analysis
    schedule, stages = _figure(entry, "pipeline"), _figure(entry, "pipeline_stages")
    kids = [_run_header(rel, a)]
    if schedule is None and stages is None:
        return kids + [_nodata(F.NO_DATA["pipeline"])]
    if schedule is not None:
        kids.append(_graph(schedule, "fig-pipeline"))
    if stages is not None:
        kids.append(_graph(stages, "fig-pipeline-stages"))
    t = R.pipeline_table(a.summary)
    if t:
        kids.append(_table(t))
    return kids


def _page_overlap(rel: str, entry: _Entry) -> list:
    a = entry.analysis
    overlap = _figure(entry, "overlap")
    kids = [
        _run_header(rel, a),
        html.H3("all-gather / reduce-scatter overlap with compute"),
        _fig_or_nodata(overlap, "overlap", "fig-overlap"),
    ]
    t = R.overlap_table(a.summary)
    if t and overlap is not None:
        kids.append(_table(t))
    kids += [html.H3("memory"), _fig_or_nodata(_figure(entry, "memory"), "memory", "fig-memory")]
    t = R.memory_table(a.summary)
    if t:
        kids.append(_table(t))
    return kids


def _page_traffic(rel: str, entry: _Entry) -> list:
    a = entry.analysis
    split = _figure(entry, "traffic_split")
    kids = [_run_header(rel, a), html.H3("traffic")]
    if split is None:
        kids.append(_nodata(F.NO_DATA["traffic_split"]))
    else:
        kids += [
            _graph(split, "fig-traffic-split"),
            _fig_or_nodata(
                _figure(entry, "traffic_matrix"), "traffic_matrix", "fig-traffic-matrix"
            ),
        ]
        t = R.traffic_table(a.summary)
        if t:
            kids.append(_table(t))
    kids += [
        html.H3("collectives"),
        _fig_or_nodata(
            _figure(entry, "collective_bandwidth"), "collective_bandwidth", "fig-bandwidth"
        ),
        _fig_or_nodata(_figure(entry, "collective_time"), "collective_time", "fig-collective-time"),
        _table(R.collectives_table(a.summary)),
        html.H3("what if the network were slower (tracekit predict)"),
        _predict_curve(entry),
    ]
    return kids


def _predict_curve(entry: _Entry) -> Any:
    """tracekit predict's sweep for this run (tracekit.figures.predict), built once."""
    from tracekit.figures import predict as FP

    fig = _memo(entry, "figure:predict_curve", lambda: FP.curve_for(entry.analysis))
    return _graph(fig, "fig-predict-curve") if fig is not None else _nodata(FP.NO_DATA)


def _page_compare(runs: Runs, chosen: list[str]) -> list:
    if len(chosen) < 1:
        return [_nodata("choose two or more runs to compare")]
    loaded, kids = [], []
    for rel in chosen:
        try:
            loaded.append((rel, runs.entry(rel).analysis.summary))
        except Refused as exc:
            return [html.P(str(exc), className="refusal")]
        except TracekitError as exc:
            kids.append(html.P(f"could not analyse {rel}: {runs.message(exc)}", className="warn"))
    if not loaded:
        return kids
    kids.append(_table(R.compare_table(loaded), "compare-table"))
    for name, fig in F.compare_figures(loaded).items():
        if fig is not None:
            kids.append(_graph(fig, f"fig-{name.replace('_', '-')}"))
    return kids


# ---------------------------------------------------------------- the app

# plotly.js, first load. dcc.Graph fetches plotly.js (4.8 MB) only when the first graph mounts,
# after the page callback has answered, and a fresh browser context then spends ~1.5 s of its
# main thread compiling it function by function (~0.2 s once cached): most of a first visit on
# a 2-core machine, whatever the run. So:
# - the app serves plotly.js's cartesian bundle (1.5 MB: bar, scatter, heatmap and a few more,
#   every trace type tracekit.figures draws; a third of the full bundle), vendored in
#   dashboards/vendor/, when it is the plotly.js version of the installed plotly (else plotly's
#   own full bundle, so plotly.js always matches the plotly that built the figures);
# - it serves that file with V8's compile hint ``//# allFunctionsCalledOnLoad`` (plotly.js
#   runs nearly all of its modules on load): Chromium compiles it on a background thread as it
#   arrives (of the full bundle's ~1.5 s, ~0.8 s stayed on the main thread; other browsers
#   ignore the comment);
# - the index preloads it, and the first callback request starts it (once the request is out),
#   so it runs while the server builds the page;
# - until it has run, window.Plotly is a promise: dcc.Graph's loader,
#   ``Promise.resolve(window.Plotly || load())``, waits for it instead of loading plotly.js again.
_COMPILE_HINT = "//# allFunctionsCalledOnLoad\n"
_RENDERER = """var renderer = new DashRenderer({request_pre: function () { setTimeout(tracekitPlotly, 0); }});
function tracekitPlotly() {
    if (window.Plotly) { return; }
    var script = document.createElement("script");
    script.src = %s;
    script.async = true;
    window.Plotly = new Promise(function (resolve, reject) {
        script.onload = resolve;
        script.onerror = function (e) { window.Plotly = undefined; reject(e); };
    });
    document.head.appendChild(script);
}"""


VENDORED_PLOTLY = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js"


@functools.cache
def _plotly_js() -> tuple[str, bytes]:
    """(file name, source) of the plotly.js the app serves: the vendored cartesian bundle if its
    header names the plotly.js version the installed plotly bundles, else plotly's full bundle."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    version = get_plotlyjs_version()
    try:
        js = VENDORED_PLOTLY.read_text(encoding="utf-8")
    except OSError:
        js = ""
    if js.startswith(f"/**\n* plotly.js (cartesian - minified) v{version}\n"):
        name = f"plotly-cartesian-{version}.min.js"
    else:
        name, js = f"plotly-{version}.min.js", get_plotlyjs()
    return name, (_COMPILE_HINT + js).encode()


def _load_plotly_early(app: Dash) -> None:
    name = "_tracekit/" + _plotly_js()[0]  # versioned: cached for good
    url = app.config.requests_pathname_prefix + name

    @app.server.route(app.config.routes_pathname_prefix + name)
    def plotly_js() -> Response:
        return Response(
            _plotly_js()[1],
            mimetype="application/javascript",
            headers={"Cache-Control": "public, max-age=31536000, immutable"},
        )

    app.index_string = app.index_string.replace(
        "{%css%}",
        '{%css%}\n        <link rel="preload" as="script" href="' + html_text.escape(url) + '">',
        1,
    )
    app.renderer = _RENDERER % json.dumps(url)


def _warm_figures() -> None:
    """Build and serialize a tiny timeline: plotly creates its figure classes and loads its
    template on first use (~0.2 s), which the first visitor's page would wait for otherwise."""
    tiny = pl.DataFrame({"rank": [0], "start_ns": [0], "end_ns": [1], "state": ["compute"]})
    pio.to_json(F.timeline_overview(tiny), validate=False)


def _number(value: Any) -> float:
    """A finite axis value from relayoutData (the browser's: anything may arrive); ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a number: {value!r}"[:80])
    number = float(value)
    if not math.isfinite(number) or abs(number) > 1e18:
        raise ValueError(f"not a finite axis value: {value!r}"[:80])
    return number


def _window(relayout: Mapping[str, Any], axis: str) -> tuple[float, float] | None:
    """``axis.range[0]``/``[1]`` or ``axis.range`` as two finite numbers; None when absent,
    ValueError when present but not two finite numbers."""
    if f"{axis}.range[0]" in relayout and f"{axis}.range[1]" in relayout:
        return _number(relayout[f"{axis}.range[0]"]), _number(relayout[f"{axis}.range[1]"])
    rng = relayout.get(f"{axis}.range")
    if rng is None:
        return None
    if isinstance(rng, (list, tuple)) and len(rng) == 2:
        return _number(rng[0]), _number(rng[1])
    raise ValueError("a range is two numbers")


def _x_window(relayout: Mapping[str, Any]) -> tuple[float, float] | None:
    return _window(relayout, "xaxis")


def _y_window(relayout: Mapping[str, Any]) -> tuple[float, float] | None:
    return _window(relayout, "yaxis")


def _guarded(fallback):  # noqa: ANN001, ANN202 - decorator factory for Dash callbacks
    """A callback that never answers HTTP 500: an error that is not TracekitError (a bug, a
    crafted request) becomes ``fallback(one line)`` for the page, and one line on stderr."""

    def wrap(fn):  # noqa: ANN001, ANN202
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


def detail_figure(
    analysis: Any, relayout: Mapping[str, Any], overview: Any = None
) -> tuple[Any, str] | None:
    """The timeline figure for a relayout event (zoom: detail; autorange: ``overview``, built
    if not given), with its info line."""
    tl = F.frame(analysis, "timeline")
    if tl is None or tl.height == 0:
        return None
    bubbles = F.frame(analysis, "bubbles")
    if relayout.get("xaxis.autorange"):
        fig = overview if overview is not None else F.timeline_overview(tl, bubbles=bubbles)
        meta = fig.layout.meta
        return fig, (
            f"overview: {meta['segments']:,} spans in {meta['bins']} bins of {F.fmt_s(meta['bin_s'])} "
            "per rank; drag to zoom"
        )
    xw = _x_window(relayout)
    if xw is None:
        return None
    yw = _y_window(relayout)
    lanes = F.timeline_lanes(tl)
    ranks = None
    if yw is not None:
        lo, hi = sorted(yw)
        ranks = [
            r for i, r in enumerate(lanes) if math.floor(lo) - 1 <= i <= math.ceil(hi) + 1
        ] or None
    fig = F.timeline_detail(
        tl,
        xw[0],
        xw[1],
        events=F.frame(analysis, "events"),
        bubbles=bubbles,
        ranks=ranks,
        y_range=yw,
    )
    meta = fig.layout.meta
    size = len(pio.to_json(fig, validate=False))
    if meta["mode"] == "detail":
        info = (
            f"detail: {meta['bars']:,} spans as bars and {meta['events']:,} events in "
            f"{F.fmt_s(abs(xw[1] - xw[0]))} (payload {size / 1024:.0f} KB)"
        )
    else:
        info = (
            f"binned: {meta['segments']:,} spans in this window (more than {F.MAX_BARS:,}); "
            f"zoom further for bars (payload {size / 1024:.0f} KB)"
        )
    return fig, info


def create_app(
    root: Path | str, *, analyses: Mapping[str, Any] | None = None, cache_size: int = CACHE_SIZE
) -> Dash:
    """The Dash app over the runs under ROOT.

    ``analyses`` adds ready-made analyses under the given names (e.g. synthetic runs); they are
    listed and chosen like runs on disk. ``cache_size``: analyses kept in memory (LRU).
    """
    root = Path(root)
    if not root.is_dir():
        raise TracekitError("no such folder", root)
    runs = Runs(root, preloaded=analyses, cache_size=cache_size)
    summaries = index.Summaries(runs)
    app = Dash(
        __name__,
        title="tracekit",
        update_title=None,
        suppress_callback_exceptions=True,
        assets_folder=str(Path(__file__).with_name("assets")),
        serve_locally=True,
    )
    app.tracekit_runs = runs  # for tests and embedding
    _load_plotly_early(app)
    _warm_figures()
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
                target_components={"page": "children"},
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
    @_guarded(
        lambda line: (
            no_update,
            no_update,
            [html.P(f"could not show this run: {line}", className="warn", id="page-error")],
        )
    )
    def render(pathname: str | None, search: str | None):
        pathname = pathname or "/"
        chosen = _runs_from_search(search)
        listed = runs.list_runs()
        known = {p for p, _ in PAGES}
        if pathname not in known:
            return (
                _nav(search or ""),
                [],
                [_nodata(f"no page {pathname!r}; pages: " + ", ".join(p for p, _ in PAGES))],
            )
        if pathname == "/compare":
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
                _page_compare(runs, chosen),
            )
        rel = chosen[0] if chosen else None
        nav = _nav(_search_for([rel]) if rel else "")
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
        if pathname == "/":
            return nav, controls, _page_index(runs, rel, entry, summaries)
        if entry is None:
            return nav, controls, [_nodata("choose a run above")]
        page = {
            "/timeline": _page_timeline,
            "/pipeline": _page_pipeline,
            "/overlap": _page_overlap,
            "/traffic": _page_traffic,
        }[pathname]
        return nav, controls, page(rel, entry)

    @app.callback(
        Output("index-table", "data"),
        Output("index-poll", "disabled"),
        Input("index-poll", "n_intervals"),
        prevent_initial_call=True,
    )
    def poll_index(n: int | None):
        rows, pending = summaries.rows()
        return rows, not pending

    @app.callback(
        Output("url", "search"),
        Input("run-select", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def pick_run(value: str | None, search: str | None):
        new = _search_for([value] if value else [])
        return no_update if new == (search or "") else new

    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("compare-select", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def pick_runs(values: list[str] | None, search: str | None):
        new = _search_for(list(values or []))
        return no_update if new == (search or "") else new

    # Zooms only: plotly also reports autosize and legend clicks as relayout events, and a later
    # event supersedes an earlier one still in flight, so they are filtered in the browser and
    # only a new x range (or a reset) reaches the server.
    app.clientside_callback(
        """function(rd) {
            if (rd && (rd['xaxis.autorange'] || rd['xaxis.range'] !== undefined
                       || rd['xaxis.range[0]'] !== undefined)) { return rd; }
            return window.dash_clientside.no_update;
        }""",
        Output("timeline-zoom", "data"),
        Input("timeline-graph", "relayoutData"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output("timeline-graph", "figure"),
        Output("timeline-info", "children"),
        Input("timeline-zoom", "data"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    @_guarded(lambda line: (no_update, f"could not draw this window: {line}"))
    def zoom(relayout: dict | None, search: str | None):
        chosen = _runs_from_search(search)
        if not isinstance(relayout, dict) or not chosen:
            return no_update, no_update
        try:
            _x_window(relayout), _y_window(relayout)
        except (ValueError, OverflowError) as exc:
            return no_update, f"zoom ignored ({exc})"
        try:
            entry = runs.entry(chosen[0])
        except (Refused, TracekitError):
            return no_update, no_update
        # going back shows the page's own overview, built once
        overview = _figure(entry, "timeline") if relayout.get("xaxis.autorange") else None
        out = detail_figure(entry.analysis, relayout, overview)
        if out is None:
            return no_update, no_update
        return out

    return app


def host_warning(host: str) -> str | None:
    """The stderr warning for a host other than this machine's loopback, else None."""
    if host in LOCAL_HOSTS:
        return None
    return (
        f"tracekit dash: warning: serving on {host}, reachable from other machines; the app has "
        "no authentication and shows every run under the root folder"
    )


def serve(root: Path | str, host: str = "127.0.0.1", port: int = 8050) -> None:
    """Run the app (blocking). Anything but localhost gets a warning on stderr."""
    warning = host_warning(host)
    if warning:
        print(warning, file=sys.stderr)
    app = create_app(root)
    print(
        f"tracekit dash: serving {Path(root).resolve()} on http://{host}:{port}/", file=sys.stderr
    )
    app.run(host=host, port=port, debug=False)
