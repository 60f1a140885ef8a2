"""Memory grows linearly with a trace's length, and the interval sweeps give exact results.

The dp sample's rank 0 repeated 4x and 16x in time (benchmarks/scaling.py builds the inputs)
is analysed in fresh subprocesses: 4 times the events may take at most 6 times the memory
(the join of every op with every label of its thread took 10x). Then the two sweeps that
replaced such joins, on hand-built intervals, against brute force.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tracekit import timeline

ROOT = Path(__file__).resolve().parents[1]
# the benchmark module by its path (benchmarks/ is not a package, nor on sys.path)
_SPEC = importlib.util.spec_from_file_location("scaling", ROOT / "benchmarks" / "scaling.py")
scaling = importlib.util.module_from_spec(_SPEC)
sys.modules["scaling"] = scaling
_SPEC.loader.exec_module(scaling)


def test_peak_memory_of_a_cpu_trace_grows_linearly(tmp_path):
    peaks = {}
    for k in (4, 16):
        folder = tmp_path / f"x{k}"
        scaling.build_in_child(scaling.SOURCES["cpu"], k, folder)
        m = scaling.measure(
            [sys.executable, "-m", "tracekit.cli", "analyze", str(folder), "--no-cache"]
            + ["--out", str(tmp_path / f"out{k}")],
            limit_bytes=6_000_000_000,  # never let a quadratic build take the machine down
        )
        assert m["rc"] == 0 and not m["killed"], m["stderr"]
        peaks[k] = m["peak_rss"]
    assert peaks[16] <= 6 * peaks[4], peaks


def _frame(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(0, "100", tid, s, e) for tid, s, e in [(r[1], r[2], r[3]) for r in rows]],
        schema={
            "rank": pl.Int32,
            "pid": pl.Utf8,
            "tid": pl.Utf8,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
        orient="row",
    )


def test_ops_inside_labels_nested_and_overlapping():
    labels = _frame([(0, "1", 0, 100), (0, "1", 10, 20), (0, "1", 150, 160), (0, "2", 0, 1000)])
    ops = _frame(
        [
            (0, "1", 5, 95),  # inside [0,100]
            (0, "1", 12, 18),  # inside both nested labels
            (0, "1", 90, 110),  # crosses the end of [0,100]: not inside
            (0, "1", 120, 130),  # between labels
            (0, "1", 150, 160),  # exactly the label
            (0, "1", 155, 170),  # crosses [150,160]
            (0, "2", 500, 600),  # thread 2's label
            (0, "3", 500, 600),  # a thread without labels
        ]
    )
    got = timeline._ops_inside(ops, labels).sort("tid", "start_ns").rows()
    assert got == [
        (0, "100", "1", 5, 95),
        (0, "100", "1", 12, 18),
        (0, "100", "1", 150, 160),
        (0, "100", "2", 500, 600),
    ]


def _random(rng: random.Random, n: int, tids: str) -> list[tuple[int, str, int, int]]:
    out = []
    for _ in range(n):
        s = rng.randrange(0, 10_000)
        out.append((0, rng.choice(tids), s, s + rng.randrange(1, 800)))
    return out


def test_sweeps_against_brute_force():
    from tracekit import p2p_time

    rng = random.Random(7)
    for _ in range(20):
        lab, op = _random(rng, 40, "12"), _random(rng, 300, "123")
        want = sorted(
            (0, "100", t, s, e)
            for _, t, s, e in op
            if any(lt == t and ls <= s and e <= le for _, lt, ls, le in lab)
        )
        got = sorted(timeline._ops_inside(_frame(op), _frame(lab)).rows())
        assert got == want
        # blocked wait: the span's tail after the last op that starts before its end
        spans, ops = _random(rng, 30, "12"), _random(rng, 300, "12")
        want_tails = []
        for _, t, s, e in spans:
            reach = max((oe for _, ot, os, oe in ops if ot == t and os < e), default=s)
            if max(s, reach) < e:
                want_tails.append((0, max(s, reach), e))
        got_tails = p2p_time.blocked(_frame(spans), _frame(ops)).rows()
        assert sorted(got_tails) == sorted(want_tails)


@pytest.mark.parametrize("n", [3_000_000_001, 10**30])
def test_step_numbers_past_int32(n):
    events = pl.DataFrame(
        {
            "rank": [0, 0],
            "device": ["cpu", "cpu"],
            "name": ["ProfilerStep#1", f"ProfilerStep#{n}"],
            "start_ns": [0, 100],
            "end_ns": [100, 200],
        },
        schema_overrides={"rank": pl.Int32},
    )
    markers = timeline.step_markers(events)
    if n < 2**63:
        assert markers["step"].to_list() == [1, n]
        assert timeline.marker_warnings(events) == []
    else:
        assert markers["step"].to_list() == [1]
        (line,) = timeline.marker_warnings(events)
        assert "past 64 bits" in line and "rank 0" in line


def test_benchmark_reports_slopes():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--inputs", "cpu"]
        + ["--factors", "1", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "exponent(time)" in out.stdout and " cpu    2x" in out.stdout
