"""``tracekit run --straggler RANK:FACTOR``: its checks, and the extra compute it plants.

The real multi-rank runs with a straggler are tests/test_straggler_validation.py (slow tier)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tracekit.capture import straggler
from tracekit.capture.launch import RunOptions, run_job
from tracekit.capture.trace import region
from tracekit.errors import TracekitError


@pytest.mark.parametrize(
    "value, words",
    [
        ("1", "must be RANK:FACTOR"),
        ("a:2", "must be RANK:FACTOR"),
        ("1:1", "more than 1 and at most 10, not 1$"),
        ("1:0.5", "more than 1"),
        ("1:11", "at most 10, not 11"),
        ("1:nan", "not nan"),
        ("2:2", "RANK must be 0 to 1 \\(--nproc 2\\), not 2"),
        ("-1:2", "RANK must be 0 to 1"),
    ],
)
def test_bad_straggler(tmp_path: Path, value: str, words: str) -> None:
    opts = RunOptions("dp", nproc=2, straggler=value, out=tmp_path / "runs")
    with pytest.raises(TracekitError, match=words) as err:
        run_job(opts)
    assert "\n" not in str(err.value)
    assert not opts.out.exists()  # refused before any rank starts


def _work(n: int) -> None:
    a = torch.randn(160, 160)
    for _ in range(n):
        a = torch.tanh(a @ a)


@pytest.fixture
def planted():
    s = straggler.install_straggler(0, 2.5, torch.device("cpu"))
    yield s
    straggler._ACTIVE = None  # the process is no straggler after the test


def test_extra_is_compute_in_the_phase(planted: straggler.Straggler) -> None:
    """The extra runs inside the phase's label as real ops, (FACTOR - 1) x the phase's compute
    (its comm regions left out), and is recorded for the step."""
    planted.step = 3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        with region("forward"):
            _work(40)
            with region("comm:all_reduce:bucket0"):
                time.sleep(0.2)  # a wait: not compute, so not slowed
        took = time.perf_counter() - t0
        with region("optimizer"):  # not a compute phase: nothing added
            _work(5)
    extra = planted.injected[3]
    base = took - extra - 0.2
    assert extra == pytest.approx(1.5 * base, rel=0.5)  # bound for a loaded machine
    assert extra < 1.5 * (took - extra)  # the sleep was left out of the phase's compute
    assert set(planted.injected) == {3}
    events = [e for e in prof.events() if e.name in ("forward", "optimizer", "aten::mm")]
    fwd = next(e for e in events if e.name == "forward")
    opt = next(e for e in events if e.name == "optimizer")
    inside = [
        e for e in events if e.name == "aten::mm" and fwd.time_range.start <= e.time_range.start
    ]
    inside = [e for e in inside if e.time_range.end <= fwd.time_range.end]
    # the extra's matmuls lie inside "forward" (the phase's own 40 and at least as many more)
    assert len(inside) > 40
    assert opt.time_range.end - opt.time_range.start < (fwd.time_range.end - fwd.time_range.start)


def test_the_extra_is_paid_before_the_communication_it_delays(
    planted: straggler.Straggler,
) -> None:
    """A bucket launched inside backward starts FACTOR x later, as on a slower device: the
    extra for the compute before a comm region runs before that region opens, not after it
    (paid at the phase's end only, dp's extra hid behind its all-reduces in flight)."""
    planted.step = 1
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with region("backward"):
            _work(30)
            with region("comm:all_reduce:bucket0"):
                time.sleep(0.05)
    events = prof.events()
    comm = next(e for e in events if e.name == "comm:all_reduce:bucket0")
    mms = [e for e in events if e.name == "aten::mm"]
    before = [e for e in mms if e.time_range.end <= comm.time_range.start]
    after = [e for e in mms if e.time_range.start >= comm.time_range.end]
    # the phase's own 30 and its extra (1.5 x their time) before the comm; after it only the
    # crumbs owed for the moments between the comm's end and the phase's (a few 128 x 128
    # matmuls; paid at the phase's end alone: 115 after, 30 before)
    assert len(before) > 30 + 10, (len(before), len(after))
    assert len(after) < 0.1 * len(before), (len(before), len(after))
