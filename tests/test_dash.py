"""The Dash app and the HTML report in real headless Chromium (Playwright, /usr/bin/chromium).

ROOT is a temporary folder holding a copy of the HTA trace_filter traces, a copy of it whose
longest kernel is renamed to an XSS payload, the committed sample runs (if any), a symlink
that leads out of ROOT and a run whose trace is a symlink out of ROOT. Two analyses are added
in memory: the synthetic 4-stage pipeline run of tests/builders/analyses.py and a 64-rank,
1,000,000-event one for draw-time measurements. Screenshots go to tests/_artifacts/.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from builders import corpus_root
from builders.analyses import big_analysis, synthetic_analysis
from builders.traces import XSS, xss_trace_folder
from conftest import HTA, serve_flask

from tracekit import runfolder

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "tests" / "_artifacts"
SECRET = "TOP-SECRET-OUTSIDE-ROOT-7f3a"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MEASURED: dict[str, str] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    corpus_root.require()  # trace_filter: the tests on this root skip without the corpus
    base = tmp_path_factory.mktemp("dash")
    root = base / "root"
    root.mkdir()
    shutil.copytree(HTA / "trace_filter", root / "trace_filter")
    xss_trace_folder(root / "xss")
    samples = REPO / "sample_traces"
    if samples.is_dir():
        for run in sorted(samples.iterdir()):
            if runfolder.is_run_folder(run):
                shutil.copytree(
                    run, root / "samples" / run.name, ignore=shutil.ignore_patterns("analysis")
                )
    outside = base / "outside"
    shutil.copytree(HTA / "trace_filter", outside / "traces")
    (outside / "traces" / "rank0.json").write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": SECRET,
                        "pid": 1,
                        "tid": 1,
                        "ts": 1,
                        "dur": 5,
                    }
                ]
            }
        )
    )
    (root / "escape").symlink_to(outside / "traces", target_is_directory=True)
    sneaky = root / "sneaky"
    (sneaky / "traces").mkdir(parents=True)
    (sneaky / "run.json").write_text(
        json.dumps({"schema_version": 1, "strategy": "dp", "world_size": 1})
    )
    (sneaky / "traces" / "rank0.json").symlink_to(outside / "traces" / "rank0.json")
    return root


def _sample_runs(root: Path) -> list[str]:
    s = root / "samples"
    return sorted(f"samples/{p.name}" for p in s.iterdir()) if s.is_dir() else []


@pytest.fixture(scope="module")
def dash_app(root):
    from dashboards.app import create_app

    return create_app(
        root,
        analyses={
            "synthetic-gpipe": synthetic_analysis(),
            "synthetic-64x1M": big_analysis(64, 1_000_000),
        },
        cache_size=16,
    )


@pytest.fixture(scope="module")
def server(dash_app):
    with serve_flask(dash_app.server) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("headless browser tests need /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield b
        b.close()
    if MEASURED:
        print("\nmeasured in Chromium:\n  " + "\n  ".join(f"{k}: {v}" for k, v in MEASURED.items()))
        if os.environ.get("TRACEKIT_MEASURED_JSON"):  # benchmarks/timing_bounds.py --dash reads it
            Path(os.environ["TRACEKIT_MEASURED_JSON"]).write_text(json.dumps(MEASURED))


@pytest.fixture()
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.dialogs = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    yield pg
    ctx.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _open(
    page, base: str, path: str, ready: str = ".js-plotly-plot .main-svg", timeout: float = 60_000
) -> None:
    page.goto(base + path)
    page.wait_for_selector(f"{ready}, .refusal, .nodata", timeout=timeout)
    page.wait_for_load_state("networkidle")


def _spa(
    page, base: str, path: str, ready: str = ".js-plotly-plot .main-svg", timeout: float = 60_000
) -> None:
    """Navigate inside the app as dcc.Link does (no reload), then wait for the new page."""
    with page.expect_response(lambda r: "_dash-update-component" in r.url, timeout=timeout):
        page.evaluate(
            "(href) => { window.history.pushState({}, '', href);"
            " window.dispatchEvent(new CustomEvent('_dashprivate_pushstate')); }",
            path,
        )
    page.wait_for_selector(f"{ready}, .refusal, .nodata", timeout=timeout)


def _count(page, sel: str) -> int:
    return page.locator(sel).count()


# ---------------------------------------------------------------- pages


def test_index_lists_runs_and_draws(page, server, root):
    _open(page, server, "/", ready="#run-list")
    listed = page.locator("#run-list").inner_text()
    assert "trace_filter" in listed and "xss" in listed and "synthetic-gpipe" in listed
    assert "escape" not in listed and "sneaky" in listed  # a symlinked folder is never listed
    for run in _sample_runs(root):
        assert run in listed
    _open(page, server, "/?run=trace_filter")
    # exposed comm split into transfer and waiting on peers (its wait states are known)
    assert _count(page, "#fig-breakdown g.trace.bars") == 6
    assert page.locator("#rank-table tbody tr").count() == 2
    _shot(page, "index-trace_filter")


@pytest.mark.parametrize(
    "path,graphs,check",
    [
        ("/timeline?run=trace_filter", 1, "#timeline-graph .heatmaplayer g.hm image"),
        ("/pipeline?run=synthetic-gpipe", 2, "#fig-pipeline g.trace.bars"),
        ("/overlap?run=synthetic-gpipe", 2, "#fig-overlap g.trace.bars"),
        ("/traffic?run=synthetic-gpipe", 4, "#fig-traffic-matrix .heatmaplayer g.hm image"),
        ("/compare?run=trace_filter&run=synthetic-gpipe", 4, "#fig-compare-breakdown g.trace.bars"),
    ],
)
def test_every_page_draws(page, server, path, graphs, check):
    _open(page, server, path)
    page.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot').length >= {graphs}", timeout=30_000
    )
    assert _count(page, ".js-plotly-plot") == graphs
    assert _count(page, check) >= 1
    if path.startswith("/pipeline"):
        # measured: bubbles fill/steady/drain + F + B; replay: F + B
        assert _count(page, "#fig-pipeline g.trace.bars") == 7
        assert "theory (p-1)/(m+p-1) 42.9%" in page.locator("#fig-pipeline").inner_text()
    if path.startswith("/overlap"):
        assert _count(page, "#fig-overlap g.trace.bars") == 4
        # params, grads, optimizer stacked; the activation peak a marker (not stacked)
        assert _count(page, "#fig-memory g.trace.bars") == 3
    if path.startswith("/compare"):
        assert page.locator("#compare-table tbody tr").count() == 2
        # every column (bubble, all-gather hidden: the last two) inside a 1400 px window
        right = page.evaluate(
            "Math.max(...[...document.querySelectorAll('#compare-table th, #compare-table td')]"
            ".map(e => e.getBoundingClientRect().right))"
        )
        assert right <= 1400, right
    _shot(page, path.strip("/").split("?")[0] + "-" + path.split("run=")[1].split("&")[0])


def test_no_data_sections_say_so(page, server):
    _open(page, server, "/pipeline?run=trace_filter", ready=".nodata")
    assert "this run has no pipeline data" in page.locator("#page").inner_text()
    _open(page, server, "/overlap?run=trace_filter", ready=".nodata")
    text = page.locator("#page").inner_text()
    assert "this run has no overlap data" in text and "this run has no memory data" in text
    _open(page, server, "/traffic?run=trace_filter")
    assert "this run has no traffic data" in page.locator("#page").inner_text()


def test_sample_runs_open(page, server, root):
    runs = _sample_runs(root)
    if not runs:
        pytest.skip("no committed sample runs in sample_traces/ yet")

    def kind(run: str) -> str:
        name = run.split("/")[-1]
        return (
            "/pipeline"
            if name.startswith("pp")
            else "/overlap"
            if name.startswith(("zero", "fsdp", "hsdp"))
            else "/traffic"
        )

    # one run of each kind keeps this short; the listing test sees them all
    chosen = {}
    for run in runs:
        chosen.setdefault(kind(run), run)
    _open(page, server, "/", ready="#run-list")
    for special, run in sorted(chosen.items()):
        name = run.split("/")[-1]
        for p in ("/timeline", special):
            _spa(page, server, f"{p}?run={run}", timeout=120_000)
            page.wait_for_function(
                f"() => (document.querySelector('#page h2') || {{}}).innerText === '{run}'",
                timeout=60_000,
            )
            assert _count(page, ".refusal") == 0
            assert _count(page, ".js-plotly-plot") >= 1
        _shot(page, f"sample-{name}-{special.strip('/')}")


# The trace types (gd.data[i].type) of the page's graphs, and those the served plotly.js lacks.
# The app serves plotly.js's cartesian bundle, which has no scattergl, table, sankey, indicator
# and others: plotly.js draws such a trace as nothing or as a plain scatter, without a word in
# the console, so a page is checked against Plotly's own list of its trace types.
_GRAPHS = "#page .dash-graph"
_TRACE_TYPES = """() => {
    const known = new Set(Object.keys(Plotly.PlotSchema.get().traces));
    const types = new Set();
    for (const gd of document.querySelectorAll('#page .js-plotly-plot')) {
        for (const t of gd.data) { types.add(t.type || 'scatter'); }
    }
    return {types: Array.from(types).sort(), unknown: Array.from(types).filter(t => !known.has(t))};
}"""


def _all_graphs_drawn(page, timeout: float = 60_000) -> None:
    """Once the page callback has answered: every dcc.Graph of it drawn and listening for zooms.
    A graph is ``.dash-graph--pending`` from the page's first render (before it mounts) until
    its plot has resolved and its event handlers are bound."""
    page.wait_for_function(
        f"""() => window.Plotly && window.Plotly.PlotSchema
        && !document.querySelector('#page .dash-graph--pending')
        && Array.from(document.querySelectorAll('{_GRAPHS}')).every(g => {{
            const gd = g.querySelector('.js-plotly-plot');
            return gd && gd._fullLayout && gd.querySelector('.main-svg');
        }})""",
        timeout=timeout,
    )


def test_every_page_of_every_run_draws_without_errors(page, server, root):
    """Every page of every sample run (and of the synthetic and HTA runs, the compare page of
    them all, and a zoom into each timeline) in Chromium: no console error, no uncaught
    exception, and every trace's type is one the served plotly.js has."""
    errors: list[str] = []
    page.on(
        "console",
        lambda m: errors.append(f"console error: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    runs = _sample_runs(root) + ["synthetic-gpipe", "trace_filter"]
    urls = [
        f"{p}?{urllib.parse.urlencode({'run': r})}"
        for r in runs
        for p in ("/", "/timeline", "/pipeline", "/overlap", "/traffic")
    ]
    urls.append("/compare?" + urllib.parse.urlencode([("run", r) for r in runs]))
    seen: set[str] = set()
    graphs = 0

    def check(what: str) -> None:
        _all_graphs_drawn(page)
        found = page.evaluate(_TRACE_TYPES)
        assert found["unknown"] == [], (what, found)
        assert errors == [], (what, errors)
        seen.update(found["types"])

    for url in urls:
        page.goto(server + url)
        page.wait_for_selector("#page h2, #compare-table, .refusal, .nodata", timeout=180_000)
        assert (
            _count(page, ".refusal") == 0
            and "could not analyse" not in page.locator("#page").inner_text()
        ), url
        check(url)
        n = _count(page, _GRAPHS)
        assert _count(page, "#page .js-plotly-plot") == n, url
        graphs += n
        if (
            url.startswith("/timeline") and n
        ):  # the zoom's figure: detail bars, or the binned window
            x0, x1 = page.evaluate(
                "() => document.querySelector('#timeline-graph .js-plotly-plot')"
                "._fullLayout.xaxis.range"
            )
            mid, half = (x0 + x1) / 2, (x1 - x0) / 200
            page.evaluate(
                "(r) => Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'),"
                " {'xaxis.range': r})",
                [mid - half, mid + half],
            )
            page.wait_for_function(
                "() => document.querySelector('#timeline-graph .js-plotly-plot').layout.meta.mode"
                " !== 'overview'",
                timeout=60_000,
            )
            check(url + " zoomed")
    assert graphs > 2 * len(runs) and errors == []
    MEASURED["trace types drawn on every page of every run"] = ", ".join(sorted(seen))


def test_dropdown_selects_run_and_updates_url(page, server):
    _open(page, server, "/timeline", ready="#run-select")
    page.click("#run-select")
    page.get_by_role("option", name="synthetic-gpipe", exact=True).click()
    page.wait_for_url("**/timeline?run=synthetic-gpipe", timeout=15_000)
    page.wait_for_selector("#timeline-graph .heatmaplayer g.hm image", timeout=30_000)
    assert "synthetic-gpipe" in page.locator("#page h2").inner_text()
    # the URL is a bookmark: reloading shows the same run
    page.reload()
    page.wait_for_selector("#timeline-graph .heatmaplayer g.hm image", timeout=30_000)
    assert "synthetic-gpipe" in page.locator("#page h2").inner_text()


# ---------------------------------------------------------------- timeline: first draw and zoom


def _first_draw_ms(page, url: str, timeout: float = 120_000) -> tuple[float, float]:
    """(navigation -> heatmap drawn, Plotly.newPlot of the same figure alone), both in ms.

    The first includes Dash's boot, the page callback and loading plotly.js (the 1.5 MB
    cartesian bundle); the second is the figure's own draw in Chromium.
    """
    page.goto(url, wait_until="commit")
    page.wait_for_selector("#timeline-graph .heatmaplayer g.hm image", timeout=timeout)
    nav = page.evaluate("() => performance.now()")
    draw = page.evaluate("""async () => {
        const gd = document.querySelector('#timeline-graph .js-plotly-plot');
        const div = document.createElement('div');
        div.style.width = gd.clientWidth + 'px';
        div.style.height = gd.clientHeight + 'px';
        document.body.appendChild(div);
        const data = gd.data.map(t => Object.assign({}, t));
        const layout = Object.assign({}, gd.layout);
        const t0 = performance.now();
        await Plotly.newPlot(div, data, layout);
        await new Promise(r => requestAnimationFrame(() => r()));
        const ms = performance.now() - t0;
        Plotly.purge(div);
        div.remove();
        return ms;
    }""")
    return nav, draw


def _zoom(page, x0: float, x1: float, want: str, timeout: float = 60_000) -> tuple[float, str]:
    return _relayout(page, {"xaxis.range": [x0, x1]}, want, timeout)


def _relayout(page, update: dict, want: str, timeout: float = 60_000) -> tuple[float, str]:
    """(ms from the relayout to the timeline drawn anew, its info line)."""
    t0 = page.evaluate("() => performance.now()")
    page.evaluate(
        "(u) => Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'), u)",
        update,
    )
    page.wait_for_function(
        f"() => document.querySelector('#timeline-info').innerText.startsWith('{want}')",
        timeout=timeout,
    )
    if want == "detail":
        page.wait_for_selector("#timeline-graph g.trace.bars path", timeout=timeout)
    if want == "overview":  # from a detail view: no heatmap until the overview is drawn
        page.wait_for_selector("#timeline-graph .heatmaplayer g.hm image", timeout=timeout)
    t1 = page.evaluate("() => performance.now()")
    return t1 - t0, page.locator("#timeline-info").inner_text()


def test_timeline_first_draw_and_zoom_4_ranks(page, server):
    url = server + "/timeline?run=synthetic-gpipe"
    _first_draw_ms(page, url)  # warms the server's cache
    nav, draw = _first_draw_ms(page, url)
    MEASURED["4-rank timeline: navigation to drawn heatmap"] = f"{nav:.0f} ms"
    MEASURED["4-rank timeline: Plotly draw of the figure"] = f"{draw:.0f} ms"
    assert _count(page, "#timeline-graph g.trace.bars path") > 0  # bubble strips only
    zoom_ms, info = _zoom(page, 0.004, 0.012, "detail")
    MEASURED["4-rank zoom to detail bars (callback + draw)"] = f"{zoom_ms:.0f} ms ({info})"
    bars = _count(page, "#timeline-graph g.trace.bars path")
    assert bars > 20
    _shot(page, "timeline-synthetic-gpipe-detail")
    page.evaluate(
        "() => Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'),"
        " {'xaxis.autorange': true, 'yaxis.autorange': true})"
    )
    page.wait_for_function(
        "() => document.querySelector('#timeline-info').innerText.startsWith('overview')"
    )


def test_timeline_zoom_by_dragging_real_trace(page, server):
    url = server + "/timeline?run=trace_filter"
    nav, draw = _first_draw_ms(page, url)
    MEASURED["trace_filter (2 ranks, 2,312 spans): navigation / Plotly draw"] = (
        f"{nav:.0f} ms / {draw:.0f} ms"
    )
    box = page.locator("#timeline-graph .nsewdrag").first.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.30, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.33, y + 2, steps=8)
    page.mouse.up()
    page.wait_for_function(
        "() => document.querySelector('#timeline-info').innerText.startsWith('detail')",
        timeout=30_000,
    )
    page.wait_for_selector("#timeline-graph g.trace.bars path", timeout=30_000)
    assert _count(page, "#timeline-graph g.trace.bars path") > 0
    _shot(page, "timeline-trace_filter-dragged")


def _payload_kb(info: str) -> float:
    """The callback payload a zoom's info line reports ("... (payload 226 KB)")."""
    return float(info.split("payload ")[1].split(" KB")[0])


def _fetches(page, pattern: str) -> list[dict]:
    """The page's requests whose URL matches the regex PATTERN: start and end times (ms)."""
    return page.evaluate(
        "(p) => performance.getEntriesByType('resource').filter(e => new RegExp(p).test(e.name))"
        ".map(e => ({start: e.startTime, end: e.responseEnd}))",
        pattern,
    )


def test_timeline_64_ranks_1m_events(browser, page, server, dash_app):
    """Issue #8 at 64 ranks and 1,000,000 events: first draw under 2 s, zoom to detail under 1 s,
    callback payloads under 2 MB. The payloads are asserted here; the times are in MEASURED and
    their bounds in benchmarks/timing_bounds.py --dash."""
    entry = dash_app.tracekit_runs.preloaded["synthetic-64x1M"]
    spans = entry.analysis.timeline.height
    url = server + "/timeline?run=synthetic-64x1M"
    assert not entry.memo  # nothing built for this run yet: the first visit builds its figure
    # a browser already running, as a user's is (the first page after launch pays ~0.5 s more
    # for starting the browser's own processes); another context, so page's stays cold
    other = browser.new_context()
    other.new_page().goto(server + "/_dash-layout")
    other.close()
    # cold: the run's figure not built, and a fresh browser context (plotly.js not compiled yet)
    cold, _ = _first_draw_ms(page, url, timeout=180_000)
    plotly_js, callbacks = (
        _fetches(page, r"plotly[^/]*[.]js"),
        _fetches(page, "_dash-update-component"),
    )
    # plotly.js loads once, while the page callback runs (not after it, as dcc.Graph would)
    assert len(plotly_js) == 1 and plotly_js[0]["start"] < callbacks[0]["end"]
    nav, draw = _first_draw_ms(page, url)
    with (
        entry.lock
    ):  # the run cold again in a warm browser: a returning user's first visit of a run
        entry.memo.clear()
    first, _ = _first_draw_ms(page, url)
    MEASURED["64-rank 1M-event timeline: navigation to drawn heatmap, cold (figures built)"] = (
        f"{cold:.0f} ms"
    )
    MEASURED[
        "64-rank 1M-event timeline: navigation to drawn heatmap, figures built, browser warm"
    ] = f"{first:.0f} ms"
    MEASURED["64-rank 1M-event timeline: navigation to drawn heatmap, warm"] = f"{nav:.0f} ms"
    MEASURED["64-rank 1M-event timeline: Plotly draw of the figure"] = f"{draw:.0f} ms"
    # issue #8's target: first draw under 2 s. A fresh browser context first compiles plotly.js,
    # whatever the run: measured here (2 cores, shared), cold was a median of 2.6 s (2.2-3.0 s)
    # with the full bundle (4.8 MB) and 1.8 s (1.4-2.2 s) with the cartesian one (1.5 MB); the
    # bounds are benchmarks/timing_bounds.py --dash's (wall time: not the suite's to judge)
    _shot(page, "timeline-64x1M-overview")
    wide_ms, wide = _zoom(page, 0.1, 0.5, "binned")
    MEASURED["64-rank zoom to a wide window (binned)"] = f"{wide_ms:.0f} ms ({wide})"
    in_window = int(wide.split("binned: ")[1].split(" spans")[0].replace(",", ""))
    assert 0 < in_window < spans  # the window's spans, not the run's
    assert _payload_kb(wide) < 2048  # ~1.5 MB: 64 lanes x 1,562 bins
    detail_ms, info = _zoom(page, 0.2, 0.2004, "detail")
    MEASURED["64-rank zoom to detail bars"] = f"{detail_ms:.0f} ms ({info})"
    assert _payload_kb(info) < 2048
    assert _count(page, "#timeline-graph g.trace.bars path") > 100
    _shot(page, "timeline-64x1M-detail")
    back_ms, _ = _relayout(page, {"xaxis.autorange": True, "yaxis.autorange": True}, "overview")
    MEASURED["64-rank back to the overview (double-click)"] = f"{back_ms:.0f} ms"


def test_pages_build_what_figures_for_builds():
    """The app builds each figure on its own, once (figure); the same figures as F.figures_for."""
    from dashboards.pages.common import figure
    from dashboards.runs import Entry
    from tracekit import figures as F

    a = synthetic_analysis()
    entry = Entry(a)
    every = F.figures_for(a)
    for name in every:
        fig = figure(entry, name)
        assert (fig is None) == (every[name] is None), name
        assert fig is None or fig.to_json() == every[name].to_json(), name
        assert figure(entry, name) is fig, name  # built once


def test_plotly_js_is_the_vendored_cartesian_bundle_with_the_compile_hint(server):
    """The cartesian bundle of dashboards/vendor/ where it is the installed plotly's plotly.js
    version (vendor that version's bundle when upgrading plotly); else plotly's full bundle."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    from dashboards.plotly_js import VENDORED_PLOTLY

    version = get_plotlyjs_version()
    vendored = VENDORED_PLOTLY.read_text(encoding="utf-8")
    if vendored.split("\n")[1] == f"* plotly.js (cartesian - minified) v{version}":
        name, js = f"plotly-cartesian-{version}.min.js", vendored
    else:
        name, js = f"plotly-{version}.min.js", get_plotlyjs()
    with urllib.request.urlopen(server + "/timeline", timeout=30) as r:
        index = r.read().decode()
    href = index.split('<link rel="preload" as="script" href="')[1].split('"')[0]
    assert f'script.src = "{href}"' in index  # the script the first callback starts
    assert href.endswith("/" + name)
    with urllib.request.urlopen(server + href, timeout=30) as r:
        assert "immutable" in r.headers["Cache-Control"]
        assert r.read().decode() == "//# allFunctionsCalledOnLoad\n" + js


def test_vendored_plotly_is_the_file_its_readme_names():
    import hashlib

    from dashboards.plotly_js import VENDORED_PLOTLY

    readme = (VENDORED_PLOTLY.parent / "README.md").read_text(encoding="utf-8")
    assert hashlib.sha256(VENDORED_PLOTLY.read_bytes()).hexdigest() in readme
    version = VENDORED_PLOTLY.read_text(encoding="utf-8").split("\n")[1].rsplit(" v", 1)[1]
    assert (
        f"plotly.js-cartesian-dist-min@{version}" in readme
        and (VENDORED_PLOTLY.parent / "LICENSE").is_file()
    )


def test_plotly_js_falls_back_to_the_full_bundle(monkeypatch, tmp_path):
    """Another plotly (another plotly.js version), or no vendored file: plotly's own full bundle."""
    import plotly.offline
    from plotly.offline import get_plotlyjs

    import dashboards.plotly_js as A

    full = "//# allFunctionsCalledOnLoad\n" + get_plotlyjs()
    served = A.bundle()
    try:
        monkeypatch.setattr(plotly.offline, "get_plotlyjs_version", lambda: "4.1.0")
        A.bundle.cache_clear()
        assert A.bundle() == ("plotly-4.1.0.min.js", full.encode())
        monkeypatch.undo()
        monkeypatch.setattr(A, "VENDORED_PLOTLY", tmp_path / "missing.js")
        A.bundle.cache_clear()
        assert A.bundle()[1] == full.encode()
    finally:
        monkeypatch.undo()
        A.bundle.cache_clear()
    assert A.bundle() == served


# ---------------------------------------------------------------- safety

REFUSED = [
    "../..",
    "/etc",
    "escape",
    "sneaky",
    "trace_filter/../../outside",
    "%2Fetc%2Fpasswd",
    "..%2F..%2Foutside",
    "C:%5CWindows",
    "~root",
    "nope",
    "trace_filter%00",
]


def test_path_traversal_is_refused(page, server):
    _open(page, server, f"/timeline?run={REFUSED[0]}", ready=".refusal")
    for i, run in enumerate(REFUSED):
        if i:
            _spa(page, server, f"/timeline?run={run}", ready=".refusal")
        shown = repr(urllib.parse.unquote(run))
        page.wait_for_function(
            "(t) => { const r = document.querySelector('.refusal');"
            " return r !== null && r.innerText.includes(t); }",
            arg=shown,
            timeout=30_000,
        )
        text = page.locator("#page").inner_text()
        assert text.startswith("refused:"), (run, text)
        assert _count(page, ".js-plotly-plot") == 0
        body = page.content()
        assert SECRET not in body and "root:x:0:0" not in body and "sampled_rank" not in body
        if run == "escape":
            _shot(page, "refused-symlink")
    for run in ("escape", "../.."):  # the same on the compare page
        _spa(page, server, f"/compare?run=trace_filter&run={run}", ready=".refusal")
        assert page.locator(".refusal").inner_text().startswith("refused:")
        assert SECRET not in page.content()


def test_resolve_refuses_everything_outside_root(root):
    from dashboards.root import Refused
    from dashboards.runs import Runs

    runs = Runs(root)
    assert runs.resolve("trace_filter") == (root / "trace_filter").resolve()
    assert runs.resolve("trace_filter/") == (root / "trace_filter").resolve()
    for bad in [
        "",
        "..",
        "../..",
        "/etc",
        "/etc/passwd",
        "escape",
        "escape/rank0.json",
        "sneaky",
        "trace_filter/../..",
        "trace_filter/../../outside",
        "..\\..",
        "C:\\Windows",
        "~",
        "~root",
        "nope",
        "trace_filter\x00",
        "x" * 2000,
    ]:
        with pytest.raises(Refused):
            runs.resolve(bad)
    assert "escape" not in runs.list_runs() and "trace_filter" in runs.list_runs()


def test_host_warning():
    from dashboards.root import host_warning

    assert host_warning("127.0.0.1") is None and host_warning("localhost") is None
    assert "reachable from other machines" in host_warning("0.0.0.0")


def test_no_files_served_outside_dash_assets(server):
    for path in (
        "/assets/../../../../etc/passwd",
        "/assets/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/_dash-component-suites/../../../../etc/passwd",
        "/escape/rank0.json",
        "/trace_filter/",
    ):
        try:
            with urllib.request.urlopen(server + path, timeout=10) as r:
                body = r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
        assert "root:x:0:0" not in body and SECRET not in body and "traceEvents" not in body


def test_trace_strings_are_text(page, server):
    _open(page, server, "/?run=xss", ready="#top-events")
    cells = page.locator("#top-events td").all_inner_texts()
    assert XSS in cells
    assert _count(page, "img[src='x']") == 0
    _open(
        page,
        server,
        "/timeline?run=synthetic-gpipe",
        ready="#timeline-graph .heatmaplayer g.hm image",
    )
    assert f"this warning names {XSS}" in page.locator("#page").inner_text()
    _zoom(page, 0.0, 0.0001, "detail")
    # hover the event whose name is the payload: plotly shows it literally
    shown = page.evaluate("""() => {
        const gd = document.querySelector('#timeline-graph .js-plotly-plot');
        const i = gd.data.findIndex(t => t.name === 'events: compute');
        const n = Array.from(gd.data[i].hovertext).findIndex(h => h.includes('&lt;img'));
        Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: n}]);
        return document.querySelector('.hoverlayer').textContent;
    }""")
    assert XSS in shown
    page.wait_for_timeout(300)
    assert page.dialogs == [] and _count(page, "img[src='x']") == 0
    _shot(page, "xss-as-text")


# ---------------------------------------------------------------- the HTML report, offline


@pytest.mark.corpus
def test_html_report_draws_offline(page, tmp_path):
    from tracekit.analysis import analyze

    out = analyze(HTA / "trace_filter").report(tmp_path / "report.html")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.route(
        "**/*", lambda r: r.abort() if not r.request.url.startswith("file:") else r.continue_()
    )
    page.goto(out.as_uri())
    page.wait_for_function(
        "() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6", timeout=30_000
    )
    assert [u for u in requests if not u.startswith(("file:", "data:", "blob:"))] == []
    # breakdown, timeline, bandwidth, collective time; the why section's wait states and critical path
    assert _count(page, ".js-plotly-plot") == 6
    assert _count(page, ".heatmaplayer g.hm image") == 2  # the timeline's, the wait states'
    assert "this run has no pipeline data" in page.locator("body").inner_text()
    _shot(page, "report-offline")


def _listening(port: int) -> set[str]:
    """Local IPv4 addresses with a socket listening on ``port`` (from /proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
            out.add(".".join(str(b) for b in reversed(bytes.fromhex(addr))))
    return out


def _start_dash(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli", "dash", str(tmp_path), "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not _listening(port) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    return proc, port


@pytest.mark.parametrize(
    "extra, address, warns", [((), "127.0.0.1", False), (("--host", "0.0.0.0"), "0.0.0.0", True)]
)
def test_tracekit_dash_binds_localhost_unless_told(tmp_path, extra, address, warns):
    """The real command: bound to 127.0.0.1 by default (nothing else on the machine's other
    addresses); another host only when asked, with a warning on stderr."""
    proc, port = _start_dash(tmp_path, *extra)
    try:
        assert _listening(port) == {address}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert ("reachable from other machines" in err) is warns
    assert f"on http://{address}:{port}/" in err
