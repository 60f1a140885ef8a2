"""`tracekit report` / `tracekit compare` in every format, on the real HTA trace_filter traces.

Each format is written through the CLI exactly as a user runs it, into a temporary folder that
must hold the report and nothing else afterwards (written to a temporary name, then renamed).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import polars as pl
import pytest
from builders.analyses import synthetic_analysis
from builders.traces import TRACE_FILTER as TF
from builders.traces import xss_trace_folder
from conftest import run_cli

from tracekit import figures as F
from tracekit.analysis import analyze
from tracekit.errors import TracekitError
from tracekit.report import default_output, write_report

CHROMIUM = Path("/usr/bin/chromium")


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


EXT = {
    "html": "html",
    "pdf": "pdf",
    "png": "png",
    "md": "md",
    "json": "json",
    "csv": "csv",
    "parquet": "parquet",
    "perfetto": "perfetto.json",
}


@pytest.mark.corpus
@pytest.mark.parametrize("fmt", list(EXT))
def test_every_format_through_the_cli(tmp_path, fmt):
    if fmt in ("pdf", "png") and not CHROMIUM.exists():
        pytest.skip("pdf/png need Chromium at /usr/bin/chromium")
    out = tmp_path / f"report.{EXT[fmt]}"
    r = run_cli("report", str(TF), "-o", str(out), "--format", fmt)
    assert r.returncode == 0, r.stderr
    assert _only(tmp_path) == [out.name]  # no temporary file left behind
    data = out.read_bytes()
    if fmt == "html":
        text = data.decode()
        assert text.count("plotly.js v") == 1  # the library embedded exactly once
        # breakdown, timeline, bandwidth, collective time, why: path and matrix
        assert text.count("Plotly.newPlot(") == 6
        assert "<script src=" not in text and not re.search(r"src=\"https?:", text)
        assert "this run has no pipeline data" in text and "this run has no traffic data" in text
    elif fmt == "pdf":
        assert (
            data.startswith(b"%PDF")
            and data.count(b"/Type /Page") - data.count(b"/Type /Pages") >= 2
        )
    elif fmt == "png":
        w, h = _png_size(data)
        assert w == 1100 and h > 1500
    elif fmt == "md":
        text = data.decode()
        assert "| rank | node | span s |" in text and "_this run has no pipeline data_" in text
        assert text.count("\n| 0 | 0 |") == 1
    elif fmt == "json":
        doc = json.loads(data)
        assert doc["schema_version"] == 1 and len(doc["runs"]) == 1
        assert [r["rank"] for r in doc["runs"][0]["summary"]["ranks"]] == [0, 1]
    elif fmt in ("csv", "parquet"):
        df = pl.read_csv(out) if fmt == "csv" else pl.read_parquet(out)
        assert df.columns[:3] == ["run", "path", "rank"] and df.height == 2
        assert df["run"].unique().to_list() == ["trace_filter"]
    elif fmt == "perfetto":
        doc = json.loads(data)
        ev = doc["traceEvents"]
        procs = {
            e["pid"]: e["args"]["name"]
            for e in ev
            if e["ph"] == "M" and e["name"] == "process_name"
        }
        assert procs == {0: "rank 0", 1: "rank 1"}
        threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
        assert {
            "tracekit: compute",
            "tracekit: communication",
            "tracekit: idle",
            "tracekit: bubble",
        } <= threads
        xs = [e for e in ev if e["ph"] == "X"]
        assert min(e["ts"] for e in xs) == 0 and all(e["dur"] >= 0 for e in xs)
        names = {e["name"] for e in xs}
        assert {"compute", "communication", "idle"} <= names and "ProfilerStep" in "".join(names)
        assert len(xs) > 9000  # the original events (9,487) plus the tracks


@pytest.mark.corpus
def test_default_output_name_in_current_folder(tmp_path):
    r = run_cli("report", str(TF), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _only(tmp_path) == ["report.html"]
    assert [str(default_output(f)) for f in ("md", "perfetto")] == [
        "report.md",
        "report.perfetto.json",
    ]


@pytest.mark.corpus
def test_comparison_of_two_paths(tmp_path):
    other = tmp_path / "runs" / "again"
    shutil.copytree(TF, other)
    out = tmp_path / "cmp.html"
    r = run_cli("report", str(TF), str(other), "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.count("plotly.js v") == 1
    assert (
        '<h2 id="comparison">comparison</h2>' in text
        and '<h2 id="run-trace-filter">trace_filter</h2>' in text
        and '<h2 id="run-again">again</h2>' in text
    )
    # the contents list links every heading; the first section says what the runs show
    ids = re.findall(r'<h[23] id="([^"]+)"', text)
    assert len(ids) == len(set(ids)) > 4
    for ident in ids:
        assert f'href="#{ident}"' in text, ident
    assert text.index('<nav class="toc"') < text.index('<h2 id="comparison">')
    show = text[text.index('id="what-the-runs-show"') : text.index('<h2 id="comparison">')]
    assert "what the runs show (2 runs)" in show and "fastest step: " in show
    assert re.search(r"slowest: \w+ \([0-9.]+ s\)", show), show
    assert (
        text.count("Plotly.newPlot(") == 3 + 2 * 6
    )  # step, breakdown, bytes (no memory) + 6 per run
    both = [analyze(TF), analyze(other)]
    md = write_report(both, tmp_path / "cmp.md", "md")
    lines = md.read_text().splitlines()
    assert "## comparison" in lines
    assert (
        sum(1 for l in lines if l.startswith("| trace_filter |") or l.startswith("| again |")) == 2
    )


@pytest.mark.corpus
def test_compare_prints_a_table_and_writes_nothing(tmp_path):
    other = tmp_path / "b"
    shutil.copytree(TF, other)
    before = _only(tmp_path)
    r = run_cli("compare", str(TF), str(other), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "comparison" in r.stdout and "trace_filter" in r.stdout and " b " in r.stdout
    assert _only(tmp_path) == before
    r = run_cli("compare", str(TF), str(other), "-o", str(tmp_path / "c.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "c.json").read_text())["runs"]) == 2
    r = run_cli("compare", str(TF))
    assert r.returncode == 2 and "at least two" in r.stderr


@pytest.mark.corpus
def test_trace_strings_are_escaped(tmp_path):
    xss = xss_trace_folder(tmp_path / "xss")
    out = tmp_path / "x.html"
    assert run_cli("report", str(xss), "-o", str(out)).returncode == 0
    text = out.read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "<img src=x" not in text and "<img" not in text
    md = write_report([analyze(xss)], tmp_path / "x.md").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in md and "<img" not in md


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "r.html"
    r = run_cli("report", str(tmp_path / "missing"), "-o", str(out))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"tracekit: {tmp_path / 'missing'}: no such file or folder"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_cli("report", str(empty), "-o", str(out))
    assert r.returncode == 2 and "no Kineto trace files" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.json").write_text("{not json")
    r = run_cli("report", str(bad), "-o", str(out))
    assert (
        r.returncode == 2 and "rank0.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    )
    r = run_cli("report", str(TF), "-o", str(out), "--format", "docx")
    assert r.returncode == 2
    assert _only(tmp_path) == ["bad", "empty"]


def test_a_failing_writer_leaves_nothing(tmp_path, monkeypatch):
    broken = synthetic_analysis()
    broken.summary.ranks = [{"rank": 0, "span_s": "not a number"}]  # fails half-way through
    with pytest.raises(Exception):  # noqa: B017 - any failure; the point is what is left
        write_report([synthetic_analysis(), broken], tmp_path / "r.html", "html")
    assert _only(tmp_path) == []
    monkeypatch.setenv("TRACEKIT_CHROMIUM", str(tmp_path / "no-such-browser"))
    with pytest.raises(TracekitError, match="TRACEKIT_CHROMIUM"):
        write_report([synthetic_analysis()], tmp_path / "r.pdf", "pdf")
    assert _only(tmp_path) == []


def test_every_section_of_a_synthetic_run(tmp_path):
    a = synthetic_analysis()
    html = write_report([a], tmp_path / "s.html", "html", names=["gpipe"]).read_text()
    assert "this run has no" not in html
    assert html.count("Plotly.newPlot(") == 10  # every figure of figures_for
    assert "theory (p-1)/(m+p-1) 42.9%" in html
    md = write_report([a], tmp_path / "s.md", "md", names=["gpipe"]).read_text()
    assert "| layers.3 | bwd | reduce_scatter |" in md and "16Psi (DP, fp32)" in md
    assert "| rank 0 | 300.000 ms | 30.0% |" in md  # the contention table
    trace = json.loads(write_report([a], tmp_path / "s.json", "perfetto").read_text())
    bubbles = [
        e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("bubble (")
    ]
    assert {e["name"] for e in bubbles} == {"bubble (fill)", "bubble (steady)", "bubble (drain)"}
    assert len(bubbles) == F.frame(a, "bubbles").height
    both = json.loads(
        write_report([a, a], tmp_path / "b.json", "perfetto", names=["x", "y"]).read_text()
    )
    procs = sorted(
        e["pid"] for e in both["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"
    )
    assert procs == [0, 1, 2, 3, 100000, 100001, 100002, 100003]


def test_the_rank_table_splits_communication_into_transfer_and_waiting(tmp_path):
    """pp-1f1b (its stages wait for activations): the table's states add up to each rank's span,
    transfer is overlap + exposed transfer, and the waiting column is the summary's wait state,
    not a part of communication (#28: waiting on a peer moves no bytes)."""
    from conftest import SAMPLES

    from tracekit.report.tables import compare_table, rank_table

    summary = analyze(SAMPLES / "pp-1f1b", cache=False).summary
    _, head, rows = rank_table(summary)
    col = {h: i for i, h in enumerate(head)}
    waits = {w.rank: w.waiting_s for w in summary.why.wait_states.per_rank}
    assert sum(waits.values()) > 0.1  # the stages wait: a real split to check
    for row in rows:
        v = {h: float(row[i]) for h, i in col.items() if h not in ("idle %",)}
        states = ("compute s", "exposed transfer s", "waiting on peers s", "other s", "idle s")
        assert sum(v[s] for s in states) == pytest.approx(v["span s"], rel=1e-3, abs=1e-5)
        assert v["transfer s"] == pytest.approx(
            v["overlap s"] + v["exposed transfer s"], rel=1e-3, abs=1e-5
        )
        assert v["waiting on peers s"] == pytest.approx(waits[int(row[0])], rel=1e-3)
    _, head, rows = compare_table([("pp", summary)])
    assert rows[0][head.index("waiting on peers %")] not in ("–", "0%")
