"""Clock alignment: a real 2-rank run with rank 1 moved onto another host's clock, recovered.

The committed DP sample is a real 2-rank gloo run on one host (one clock). Rank 1's trace is
rewritten as if it came from a host whose clock runs OFFSET_NS ahead: its baseTimeNanoseconds
and host_name change, and so do its flight-recorder entry times (same host clock). The
alignment must recover OFFSET_NS within the jitter of the collectives' ends observed in the
untouched run.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis import analyze

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DP = REPO / "sample_traces" / "dp"
OFFSET_NS = 1_234_567_891  # rank 1's clock runs 1.23 s ahead


def _shift_rank(run: Path, rank: int, offset_ns: int, host: str) -> None:
    path = run / "traces" / f"rank{rank}.json.gz"
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    trace["baseTimeNanoseconds"] += offset_ns
    trace["host_name"] = host
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    fr_path = run / "nccl" / f"fr_rank{rank}.json"
    dump = json.loads(fr_path.read_text())
    for e in dump.get("entries", []):
        e["time_created_ns"] += offset_ns
    fr_path.write_text(json.dumps(dump))


@pytest.fixture(scope="module")
def original():
    return analyze(SAMPLE_DP)


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("clock") / "dp"
    shutil.copytree(SAMPLE_DP, run, ignore=shutil.ignore_patterns("analysis"))
    _shift_rank(run, 1, OFFSET_NS, "other-host")
    return run


def _end_jitter(a) -> int:
    """The largest |end_1 - end_0| over matched end-synchronous calls of one-clock traces."""
    m = a.frames["collective_matches"].filter(
        pl.col("op").is_in(["all_reduce", "all_gather", "barrier"])
    )
    ends = m.pivot(on="rank", index="call_id", values="end_ns")
    return int((ends["1"] - ends["0"]).abs().max())


def test_offset_recovered_within_the_end_jitter(original, shifted: Path) -> None:
    jitter = _end_jitter(original)
    a = analyze(shifted)
    clock = a.summary.clock
    assert clock.applied is True and clock.reference_rank == 0
    est = clock.offsets_ns["1"]
    assert abs(est - OFFSET_NS) <= jitter, (est, OFFSET_NS, jitter)
    assert clock.per_host == {"vm": 0, "other-host": est}
    assert clock.calls["1"] == original.summary.matching.complete_calls
    # applied: rank 1's window is back where the one-clock run had it
    w0 = {r.rank: r.start_ns for r in original.summary.window.per_rank}
    w1 = {r.rank: r.start_ns for r in a.summary.window.per_rank}
    assert w1[0] == w0[0] and abs(w1[1] - w0[1]) <= jitter
    # attribution still works: each rank's dump is matched on its own clock
    assert a.summary.matching.complete_calls == original.summary.matching.complete_calls


def test_offsets_reported_but_not_applied_on_one_host(original) -> None:
    clock = original.summary.clock
    assert clock.applied is False and "one host" in clock.reason
    assert abs(clock.offsets_ns["1"]) <= _end_jitter(original)


def test_unaligned_traces_show_the_skew(shifted: Path) -> None:
    a = analyze(shifted, align_clocks=False)
    assert a.summary.clock.applied is False
    w = {r.rank: r.start_ns for r in a.summary.window.per_rank}
    assert abs((w[1] - w[0]) - OFFSET_NS) < 0.1 * OFFSET_NS  # the skew is all there
