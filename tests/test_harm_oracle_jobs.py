"""The harm oracle for the commands that start jobs or serve pages (issue #24 item 6; slow tier).

tests/test_harm_oracle.py draws analyze, report, compare and predict among decoys; this module
puts ``tracekit run`` and ``tracekit demo`` (real 2-rank gloo jobs) with their ``--out`` on and
among the same decoys, and serves the Dash app over the sandbox and asks for every page of its
runs, the index and the compare page. The same judge: every decoy and every input is as it was
(new run folders may appear, nothing that was there changes), no traceback, exit 0 or one line.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import serve_flask
from test_dash_hostile import _page
from test_harm_oracle import _make, check, snapshot

#: --out places: a decoy folder, a temp-looking folder, the run itself, a file, a read-only
#: file, a FIFO, a link to /dev/zero, a new folder
PLACES = ["udata", ".thesis.old-4242", "RUN", "ro.txt", "pipe", "zero", "new/sub"]


@pytest.mark.parametrize("place", PLACES)
def test_run_among_decoys(place: str) -> None:
    check(["run", "dp", "--nproc", "2", "--steps", "1", "--out", place], None, {})


def test_demo_among_decoys() -> None:
    check(["demo", "--only", "dp", "--out", ".y.tmp-4242-deadbeef"], None, {})


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_the_app_among_decoys(tmp_path: Path) -> None:
    """Every page of both runs, the index and the compare page, served over the sandbox: they
    answer, and the sandbox is as it was but the analyses the app writes for its runs."""
    from dashboards.app import create_app
    from dashboards.pages import PAGES

    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    _make(sandbox)
    before = snapshot(sandbox)
    app = create_app(sandbox, analysis_timeout=120)
    with serve_flask(app.server) as url:
        code, text = _get(url + "/")
        assert code == 200, text[:300]
        pages = 0
        for page in PAGES:
            for search in ["?run=RUN&run=RUN2"] if page.many else ["?run=RUN", "?run=RUN2"]:
                code, text = _page(url, search, timeout=300, pathname=page.path)
                assert code == 200 and "Traceback" not in text, (page.path, search, text[:500])
                pages += 1
        assert pages > 10  # every section's page of both runs, the index and the compare page
    after = snapshot(sandbox)
    # the app analyses each run into RUN/analysis (its own folder, new): nothing else changes
    changed = sorted(p for p, was in before.items() if after.get(p) != was)
    assert not changed, f"harmed: {changed}"
