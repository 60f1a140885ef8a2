"""The Dash index in real headless Chromium: a sortable table of the runs under ROOT.

ROOT holds copies of sample runs (dp, zero3, pp-gpipe), a second zero3 whose run.json says
prefetch 0, and HTA's trace_filter (a trace folder without run.json). None has an analysis on
disk, so the app analyses them in the background while the page polls. Each number shown is
checked against the run's own summary; a sort click reorders the rows; unknown shows "–".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import HTA, serve_flask

from tracekit import figures as F
from tracekit.analysis import analyze

pytestmark = [pytest.mark.slow, pytest.mark.corpus]
CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
COLUMNS = [
    "run",
    "strategy",
    "ranks",
    "status",
    "step time",
    "exposed comm",
    "bubble",
    "all-gather hidden",
    "diagnosis",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    if not all((SAMPLES / n).is_dir() for n in ("dp", "zero3", "pp-gpipe")):
        pytest.skip("sample_traces/ is not there")
    root = tmp_path_factory.mktemp("index") / "root"
    for name in ("dp", "zero3", "pp-gpipe"):
        shutil.copytree(SAMPLES / name, root / name, ignore=shutil.ignore_patterns("analysis"))
    shutil.copytree(SAMPLES / "zero3", root / "zero3-p0", ignore=shutil.ignore_patterns("analysis"))
    run_json = root / "zero3-p0" / "run.json"
    data = json.loads(run_json.read_text())
    data["config"]["prefetch"] = 0
    run_json.write_text(json.dumps(data))
    shutil.copytree(
        HTA / "trace_filter", root / "trace_filter", ignore=shutil.ignore_patterns("analysis")
    )
    return root


@pytest.fixture(scope="module")
def server(root):
    from dashboards.app import create_app

    with serve_flask(create_app(root).server) as url:
        yield url


@pytest.fixture(scope="module")
def page():
    if not CHROMIUM.exists():
        pytest.skip("headless browser tests need /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser.new_page(viewport={"width": 1400, "height": 900})
        browser.close()


def _column(page, column_id: str) -> list[str]:
    return [
        t.strip()
        for t in page.locator(f'#index-table td[data-dash-column="{column_id}"]').all_inner_texts()
    ]


def _load_index(page, server: str) -> None:
    page.goto(server + "/")
    page.wait_for_selector("#index-table td", timeout=60_000)
    # rows fill in as the background analyses finish (the page polls once a second)
    page.wait_for_function(
        "() => !document.querySelector('#index-table').innerText.includes('analysing')",
        timeout=240_000,
    )


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def test_index_lists_every_run_with_its_numbers(page, server, root):
    _load_index(page, server)
    head = [t.strip() for t in page.locator("#index-table th").all_inner_texts()]
    assert head == COLUMNS
    runs = _column(page, "run")
    assert runs == ["dp", "pp-gpipe", "trace_filter", "zero3", "zero3-p0"]
    strategy = dict(zip(runs, _column(page, "strategy")))
    assert strategy == {
        "dp": "dp",
        "pp-gpipe": "pp-gpipe (4 microbatches)",
        "trace_filter": "trace_filter",
        "zero3": "zero3",
        "zero3-p0": "zero3 (prefetch 0)",
    }
    cells = {
        c: dict(zip(runs, _column(page, c)))
        for c in ("ranks", "status", "step_s", "exposed", "bubble", "allgather_hidden", "why")
    }
    for run in runs:
        (r,) = F.compare_rows([(run, analyze(root / run).summary)])
        assert cells["ranks"][run] == str(r["ranks"])
        assert cells["step_s"][run] == f"{r['step_time_s']:.4f} s"
        assert cells["exposed"][run] == _pct(r["exposed_comm_s"] / r["span_s"])
        assert cells["bubble"][run] == _pct(r["bubble_fraction"])
        assert cells["allgather_hidden"][run] == _pct(r["allgather_hidden_fraction"])
        why = analyze(root / run).summary.why
        assert cells["why"][run] == (why.diagnosis[0] if why else "–")
    assert cells["status"] == {
        "dp": "ok",
        "pp-gpipe": "ok",
        "trace_filter": "–",
        "zero3": "ok",
        "zero3-p0": "ok",
    }
    # not applicable is unknown, never 0: no bubble outside the pipeline, no all-gather in dp
    assert cells["bubble"]["pp-gpipe"] != "–" and cells["allgather_hidden"]["zero3"] != "–"
    for run in ("dp", "trace_filter", "zero3"):
        assert cells["bubble"][run] == "–"
    for run in ("dp", "pp-gpipe", "trace_filter"):
        assert cells["allgather_hidden"][run] == "–"
    page.screenshot(path=str(root.parent / "index.png"), full_page=True)


def test_a_sort_click_reorders_the_rows(page, server):
    _load_index(page, server)
    before = _column(page, "run")

    def steps() -> list[float]:
        return [float(s.removesuffix(" s")) for s in _column(page, "step_s")]

    sort = page.locator('#index-table th[data-dash-column="step_s"] .column-header--sort')
    sort.click()
    page.wait_for_function(
        f"() => JSON.stringify(Array.from(document.querySelectorAll("
        f"'#index-table td[data-dash-column=\"run\"]')).map(t => t.innerText.trim())) "
        f"!== '{json.dumps(before)}'",
        timeout=10_000,
    )
    ascending = _column(page, "run")
    assert steps() == sorted(steps()) and ascending != before
    sort.click()
    page.wait_for_function(
        f"() => document.querySelector('#index-table td[data-dash-column=\"run\"]').innerText"
        f".trim() === '{ascending[-1]}'",
        timeout=10_000,
    )
    assert steps() == sorted(steps(), reverse=True)
    # sorted by bubble: the one pipeline first, the runs without a bubble ("–") after it
    bubble = page.locator('#index-table th[data-dash-column="bubble"] .column-header--sort')
    bubble.click()
    page.wait_for_function(
        "() => document.querySelector('#index-table td[data-dash-column=\"run\"]').innerText"
        ".trim() === 'pp-gpipe'",
        timeout=10_000,
    )
    assert _column(page, "bubble")[1:] == ["–"] * 4


def test_clicking_a_run_opens_its_page(page, server):
    _load_index(page, server)
    page.locator('#index-table td[data-dash-column="run"] a', has_text="zero3-p0").click()
    page.wait_for_function(
        "() => (document.querySelector('#page h2') || {}).innerText === 'zero3-p0'",
        timeout=120_000,
    )
    assert "run=zero3-p0" in page.url
    page.wait_for_selector("#rank-table tbody tr", timeout=60_000)
    assert page.locator("#rank-table tbody tr").count() == 2
