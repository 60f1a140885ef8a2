"""The Dash app against hostile runs and requests (issue #24: every wait bounded, no HTTP 500).

- Runs whose analysis never ends: ``memory/rank0.json`` a FIFO (``open()`` blocks in the kernel
  until a writer comes: a thread no stop request reaches), more of them than the index has
  workers, and a run whose trace is simply big (120 MB: its analysis really takes longer than
  the app's timeout). Until issue #24 one background thread analysed the runs in turn: the
  first FIFO held every run after it at "analysing…" and its page request never answered.
  Now each run is failed after the timeout, saying so, the others fill in, and the page of a
  bad run answers within the timeout and a little more (at once the second time).
- Malformed callbacks: a 4xx with a short message, never a traceback (body or stderr).

The HTTP tests serve the real app on 127.0.0.1 and speak Dash's own callback protocol; the
browser test drives it in headless Chromium (slow tier).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import serve_flask

from tracekit import runfolder

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
CHROMIUM = Path("/usr/bin/chromium")
#: the app's analysis timeout here: a sample run takes about 1 s to analyse (10x margin), the big
#: trace about 20 s unloaded
TIMEOUT_S = 10.0
FIFOS = 4  # more than the index's workers (dashboards.index.INDEX_WORKERS = 3)
PAGE_OUT = "..nav.children...controls.children...page.children.."
PAGE_OUTPUTS = [
    {"id": "nav", "property": "children"},
    {"id": "controls", "property": "children"},
    {"id": "page", "property": "children"},
]


def _release(fifos: list[Path]) -> None:
    """Let the threads blocked opening FIFOS go: a writer that comes and leaves (they read EOF)."""
    for fifo in fifos:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader left on it


def _fifo_outcome(status: str) -> str | None:
    """A FIFO run's index status: None when it was analysed all the same ("ok": a reader that
    refuses FIFOs without blocking and skips the memory file, as tracekit's guarded reader
    may), else why it is not analysable: the timeout while its read blocks, or the reader's
    refusal. Anything else fails the test."""
    if status == "ok":
        return None
    assert status.startswith("ok; not analysable: "), status
    return status.removeprefix("ok; not analysable: ")


def _fifo_run(root: Path, name: str) -> Path:
    """A copy of sample dp whose memory/rank0.json is a FIFO nobody writes."""
    run = root / name
    shutil.copytree(SAMPLES / "dp", run, ignore=shutil.ignore_patterns("analysis"))
    (run / "memory" / "rank0.json").unlink()
    os.mkfifo(run / "memory" / "rank0.json")
    return run / "memory" / "rank0.json"


def big_trace(folder: Path, events: int = 1_000_000) -> Path:
    """A one-rank trace folder of EVENTS cpu ops (80 MB a million): a real, slow analysis."""
    folder.mkdir(parents=True)
    ops = ",".join(
        f'{{"ph":"X","cat":"cpu_op","name":"op{i % 50}","pid":1,"tid":1,"ts":{i},"dur":0.5}}'
        for i in range(events)
    )
    text = '{"distributedInfo":{"rank":0,"world_size":1},"traceEvents":[' + ops + "]}"
    (folder / "rank0.json").write_text(text)
    return folder


def _analysed_copy(root: Path, name: str) -> Path:
    """A copy of sample run NAME with its analysis on disk (tracekit analyze): the app reads its
    summary.json, it analyses nothing."""
    run = root / name
    shutil.copytree(SAMPLES / name, run, ignore=shutil.ignore_patterns("analysis"))
    proc = subprocess.run(
        [sys.executable, "-m", "tracekit.cli", "analyze", str(run), "--out", str(run / "analysis")],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    assert (runfolder.analysis_dir(run) / "summary.json").is_file()
    return run


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory) -> Iterator[tuple[Path, list[Path]]]:
    """ROOT: dp (analysed by the app), zero1 (its analysis on disk), FIFOS runs with a FIFO."""
    if not all((SAMPLES / n).is_dir() for n in ("dp", "zero1")):
        pytest.skip("sample_traces/ is not there")
    root = tmp_path_factory.mktemp("hostile") / "root"
    # the FIFO runs sort first: the old single thread met them before any good run
    fifos = [_fifo_run(root, f"a-fifo{i}") for i in range(FIFOS)]
    shutil.copytree(SAMPLES / "dp", root / "dp", ignore=shutil.ignore_patterns("analysis"))
    _analysed_copy(root, "zero1")
    yield root, fifos
    _release(fifos)


def _post(url: str, body: dict | bytes, timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(
        url + "/_dash-update-component",
        data=body if isinstance(body, bytes) else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _page(url: str, search: str, timeout: float, pathname: str = "/") -> tuple[int, str]:
    """The app's page callback for PATHNAME?SEARCH, as the browser posts it."""
    body = {
        "output": PAGE_OUT,
        "outputs": PAGE_OUTPUTS,
        "inputs": [
            {"id": "url", "property": "pathname", "value": pathname},
            {"id": "url", "property": "search", "value": search},
        ],
        "changedPropIds": ["url.pathname"],
    }
    return _post(url, body, timeout)


def _index_rows(url: str) -> tuple[list[dict], bool]:
    body = {
        "output": "..index-table.data...index-poll.disabled..",
        "outputs": [
            {"id": "index-table", "property": "data"},
            {"id": "index-poll", "property": "disabled"},
        ],
        "inputs": [{"id": "index-poll", "property": "n_intervals", "value": 1}],
        "changedPropIds": ["index-poll.n_intervals"],
    }
    status, text = _post(url, body, timeout=30)
    assert status == 200, text[:500]
    response = json.loads(text)["response"]
    return response["index-table"]["data"], not response["index-poll"]["disabled"]


def test_fifo_runs_hold_neither_the_index_nor_their_page(hostile_root):
    from dashboards.app import create_app

    root, fifos = hostile_root
    app = create_app(root, analysis_timeout=TIMEOUT_S)
    with serve_flask(app.server) as url:
        t0 = time.monotonic()
        # every FIFO run in its own worker (4 > 3 index workers), the good ones after them
        deadline = t0 + 2 * FIFOS * TIMEOUT_S + 60
        rows, pending = _index_rows(url)
        while pending and time.monotonic() < deadline:
            time.sleep(0.5)
            rows, pending = _index_rows(url)
        waited = time.monotonic() - t0
        status = {r["id"]: r["status"] for r in rows}
        assert not pending, f"still analysing after {waited:.0f} s: {status}"
        late = f"analysis took longer than {TIMEOUT_S:g} s"
        assert status["dp"] == "ok" and status["zero1"] == "ok", status
        why = {i: _fifo_outcome(status[f"a-fifo{i}"]) for i in range(FIFOS)}
        good = {r["id"]: r for r in rows if r["id"] in ("dp", "zero1")}
        assert all(isinstance(r["step_s"], float) and r["step_s"] > 0 for r in good.values())
        # the FIFO run's page: its one line, at once (the index found it stuck, or refused)
        t1 = time.monotonic()
        code, text = _page(url, "?run=a-fifo0", timeout=TIMEOUT_S + 30)
        took = time.monotonic() - t1
        assert code == 200 and "Traceback" not in text, text[:500]
        if why[0] is not None:
            assert f"could not analyse this run: {why[0]}" in text, text[:500]
            assert took < TIMEOUT_S
        else:
            assert "rank-table" in text, text[:500]
        print(f"index complete after {waited:.1f} s ({why}); FIFO page {took:.2f} s")
    # each thread stuck in a read was written off and replaced, never more than the bound
    pool = app.tracekit_summaries.pool
    assert pool._stuck == sum(w == late for w in why.values()) and pool._live == pool.workers


def test_a_fifo_runs_page_answers_within_the_timeout(hostile_root):
    """The page asked first (no index before it): it waits the timeout, then says why."""
    from dashboards.app import create_app

    root, _ = hostile_root
    app = create_app(root, analysis_timeout=TIMEOUT_S)
    with serve_flask(app.server) as url:
        late = f"could not analyse this run: analysis took longer than {TIMEOUT_S:g} s"
        t0 = time.monotonic()
        code, text = _page(url, "?run=a-fifo1", timeout=TIMEOUT_S + 60)
        first = time.monotonic() - t0
        assert code == 200 and "Traceback" not in text, text[:500]
        blocked = late in text  # its read blocked (else the reader refused the FIFO at once)
        if blocked:
            assert TIMEOUT_S - 1 < first < TIMEOUT_S + 30
        else:
            assert first < TIMEOUT_S, first
        t0 = time.monotonic()
        code, again_text = _page(url, "?run=a-fifo1", timeout=TIMEOUT_S + 60)
        again = time.monotonic() - t0
        assert code == 200 and (late in again_text) == blocked, again_text[:500]
        assert again < TIMEOUT_S / 2  # remembered: no second thread stuck on it
        # a good run's page still answers with its analysis
        code, text = _page(url, "?run=dp", timeout=120)
        assert code == 200 and "rank-table" in text, text[:500]
        print(f"FIFO page: {first:.2f} s, again {again:.3f} s")
    assert app.tracekit_runs.pool._stuck == (1 if blocked else 0)


#: the timeout against a 120 MB trace (1.5M events), whose analysis takes about 6 s on an idle
#: machine here and 30 s loaded (12x to 60x); dp's summary.json is read in milliseconds
SLOW_TIMEOUT_S = 0.5
SLOW_EVENTS = 1_500_000


@pytest.mark.slow(reason="a 120 MB trace analysed until the timeout stops it")
def test_a_run_too_slow_to_analyse_is_stopped_and_shown_failed(tmp_path: Path):
    """A real analysis slower than the timeout (a 120 MB trace): failed, saying so, while dp
    beside it fills in (from its summary.json: nothing else to analyse within so short a
    timeout); its thread comes back to the pool (stopped at the scanner's next check, or at the
    end of the analysis when the stop came during polars' sections, which do not check)."""
    from dashboards.app import create_app

    root = tmp_path / "root"
    _analysed_copy(root, "dp")
    big_trace(root / "big", SLOW_EVENTS)
    app = create_app(root, analysis_timeout=SLOW_TIMEOUT_S)
    late = f"analysis took longer than {SLOW_TIMEOUT_S:g} s"
    with serve_flask(app.server) as url:
        t0 = time.monotonic()
        rows, pending = _index_rows(url)
        while pending and time.monotonic() < t0 + 120:
            time.sleep(0.25)
            rows, pending = _index_rows(url)
        status = {r["id"]: r["status"] for r in rows}
        assert status == {"big": f"–; not analysable: {late}", "dp": "ok"}
        t1 = time.monotonic()
        code, text = _page(url, "?run=big", timeout=60)
        assert code == 200 and f"could not analyse this run: {late}" in text, text[:500]
        assert time.monotonic() - t1 < 30  # at once: remembered, not analysed again
    pool = app.tracekit_summaries.pool
    deadline = time.monotonic() + 120
    while pool._stuck and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool._stuck == 0 and pool._live == pool.workers, "its thread never came back"
    print(f"the failed analysis's thread came back {time.monotonic() - t0:.1f} s after it began")


@pytest.mark.slow(reason="Chromium through Playwright")
def test_the_index_in_chromium_fills_in_beside_a_fifo_run(hostile_root):
    """The real page: every good row fills in while the FIFO runs show why they are not
    analysed, and clicking one opens its page, which says so in one line."""
    if not CHROMIUM.exists():
        pytest.skip("headless browser tests need /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    from dashboards.app import create_app

    root, _ = hostile_root
    app = create_app(root, analysis_timeout=TIMEOUT_S)
    with serve_flask(app.server) as url, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/")
            page.wait_for_selector("#index-table td", timeout=60_000)
            page.wait_for_function(
                "() => !(document.querySelector('#index-table') || {innerText: 'analysing'})"
                ".innerText.includes('analysing')",
                timeout=int((2 * FIFOS * TIMEOUT_S + 60) * 1000),
            )
            cells = page.locator('#index-table td[data-dash-column="status"]').all_inner_texts()
            runs = page.locator('#index-table td[data-dash-column="run"]').all_inner_texts()
            status = dict(zip([r.strip() for r in runs], [c.strip() for c in cells]))
            assert sorted(status) == [*(f"a-fifo{i}" for i in range(FIFOS)), "dp", "zero1"]
            assert status["dp"] == "ok" and status["zero1"] == "ok", status
            why = _fifo_outcome(status["a-fifo2"])
            steps = page.locator('#index-table td[data-dash-column="step_s"]').all_inner_texts()
            by_run = dict(zip([r.strip() for r in runs], [s.strip() for s in steps]))
            assert by_run["dp"].endswith(" s")
            assert (by_run["a-fifo2"] == "–") == (why is not None)  # unknown, never 0
            page.locator('#index-table td[data-dash-column="run"] a', has_text="a-fifo2").click()
            page.wait_for_function(
                "() => { const p = document.querySelector('#page'); return p && ("
                "p.innerText.includes('could not analyse') || !!p.querySelector('#rank-table')) }",
                timeout=int((TIMEOUT_S + 30) * 1000),
            )
            text = page.locator("#page").inner_text()
            assert "Traceback" not in text
            if why is not None:
                assert f"could not analyse this run: {why}" in text, text[:500]
        finally:
            browser.close()


def _valid_page_body() -> dict:
    return {
        "output": PAGE_OUT,
        "outputs": PAGE_OUTPUTS,
        "inputs": [
            {"id": "url", "property": "pathname", "value": "/"},
            {"id": "url", "property": "search", "value": ""},
        ],
        "changedPropIds": ["url.pathname"],
    }


def _crafted() -> dict[str, bytes]:
    """Callback requests a browser running the app never sends, each raising inside Dash before."""
    page = _valid_page_body()

    def with_(**changes: object) -> bytes:
        return json.dumps({**page, **changes}).encode()

    return {
        "not JSON": b"{not json",
        "empty": b"",
        "a JSON list": b"[1, 2]",
        "a JSON string": b'"output"',
        "an empty object": b"{}",
        "an unknown output": with_(output="nope.children", outputs={"id": "nope"}),
        "an output that is a number": with_(output=5),
        "an output id that is an object": with_(output='{"a":1}.children'),
        "fewer outputs": with_(outputs=PAGE_OUTPUTS[:1]),
        "inputs a number": with_(inputs=5),
        "inputs without property": with_(inputs=[{"id": "url"}, {"id": "url"}]),
        "one input too many": with_(inputs=[*page["inputs"], page["inputs"][0]]),
        "changedPropIds a string": with_(changedPropIds="url.pathname"),
        "nested 100,000 deep": b'{"output":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "30 MB long": b'{"output":"' + b"x" * (30 << 20) + b'"}',
        "not UTF-8": b'{"output":"\xff\xfe"}',
    }


def test_malformed_callbacks_get_a_4xx_and_one_line(tmp_path: Path, capfd):
    from dashboards.app import create_app

    shutil.copytree(SAMPLES / "dp", tmp_path / "dp", ignore=shutil.ignore_patterns("analysis"))
    app = create_app(tmp_path)
    with serve_flask(app.server) as url:
        capfd.readouterr()
        for name, body in _crafted().items():
            code, text = _post(url, body, timeout=60)
            assert 400 <= code < 500, (name, code, text[:300])
            assert len(text) < 300 and "Traceback" not in text and "<html" not in text, name
            assert text.count("\n") == 1, (name, text)
        # the app still answers the real thing
        code, text = _post(url, _valid_page_body(), timeout=60)
        assert code == 200 and "dp" in text
        # and other mistakes answer a line too: unknown scripts and assets
        for path in ("/_dash-component-suites/nope/x.js", "/assets/nope.css"):
            try:
                urllib.request.urlopen(url + path, timeout=30)
                raise AssertionError(f"{path} answered 2xx")
            except urllib.error.HTTPError as exc:
                body = exc.read().decode()
                assert 400 <= exc.code < 500 and "<html" not in body, (path, exc.code, body)
    err = capfd.readouterr().err
    assert "Traceback" not in err and 'File "' not in err, err[-3000:]


def test_the_pool_bounds_the_threads_stuck_in_reads(tmp_path: Path):
    """Reads of FIFOs nobody writes, on a pool of 1 worker that may write off 2 threads: each
    is failed at the timeout and its thread replaced, until 3 are stuck; then jobs fail at once,
    saying why, instead of queueing forever; once the reads return the pool works again."""
    from dashboards.pool import Pool

    fifos = [tmp_path / f"fifo{i}" for i in range(3)]
    for f in fifos:
        os.mkfifo(f)
    pool = Pool(workers=1, timeout_s=0.5, name="test-pool", max_stuck=2)
    try:
        stuck = [pool.submit(f, lambda f=f: f.read_bytes()) for f in fifos]
        for job in stuck:
            assert job.wait(30), "a job stuck in its read was never failed"
            assert job.timed_out and job.error == "analysis took longer than 0.5 s"
        assert pool._stuck == 3 and pool._live == 0
        refused = pool.submit("after", lambda: 42)
        assert refused.done and "3 analyses are stuck" in (refused.error or ""), refused.error
    finally:
        _release(fifos)
    deadline = time.monotonic() + 30
    while pool._stuck and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool._stuck == 0 and pool._live == 1
    again = pool.submit("again", lambda: 42)
    assert again.wait(30) and again.value == 42 and again.error is None
