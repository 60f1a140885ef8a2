"""tracekit.capture.contention against real processes made to wait for a CPU (issue #27).

Behaviour, not timing bounds: two busy processes pinned to one core each wait for it about half
the time, behind the other process; a busy step sharing its core with a busy thread of its own
waits as long, behind its own thread, not behind another process; a process that mostly sleeps
does not wait at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracekit.capture import contention

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/task"),
    reason="needs Linux /proc and sched_setaffinity",
)

_CHILD = r"""
import json, os, sys, threading, time
from tracekit.capture.contention import ContentionMeter
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {core})
busy = sys.argv[1] in ("busy", "own")
rival = None
stop = threading.Event()
if sys.argv[1] == "own":  # a busy thread of the process itself (as a rank's gloo thread)
    def spin():
        while not stop.is_set():
            sum(range(1000))
    threading.Thread(target=spin, daemon=True).start()
if sys.argv[1] == "busy":
    rival = os.fork()
    if rival == 0:  # a second busy process on the same core
        os.sched_setaffinity(0, {core})
        while True:
            pass
meter = ContentionMeter()
for k in range(3):
    with meter.step(k):
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:
            if not busy:
                time.sleep(0.02)
stop.set()
if rival:
    os.kill(rival, 9)
print(json.dumps(meter.record(warmup=1)))
"""


def _measure(kind: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


def test_a_rank_sharing_its_core_waits_for_it() -> None:
    rec = _measure("busy")
    assert [s["step"] for s in rec["steps"]] == [1, 2]  # warm-up step 0 left out
    assert rec["unavailable"] is None
    # two busy processes on one core: each runnable all the time, on the CPU about half of it
    assert rec["total"]["runqueue_share"] > 0.3
    # the step ran on the one thread: its own wait is the process's, and at most the wall time
    assert 0.3 < rec["total"]["cpu_wait_share"] <= 1.0
    assert all(0 <= s["cpu_wait_s"] <= s["wall_s"] for s in rec["steps"])
    assert rec["total"]["involuntary_switches"] > 0
    assert rec["total"]["cpu_s"] < rec["total"]["wall_s"]
    # it waited behind the other process: its own process had no other thread to wait behind
    assert rec["total"]["cpu_wait_outside_share"] > 0.3
    assert rec["total"]["other_threads_cpu_s"] < 0.1 * rec["total"]["wall_s"]


def test_waiting_behind_its_own_thread_is_not_outside_contention() -> None:
    rec = _measure("own")
    total = rec["total"]
    assert total["cpu_wait_share"] > 0.1  # the step waited for the core all the same (GIL: ~18 %)
    # the core ran the process's own other thread meanwhile: that accounts for the wait
    assert total["other_threads_cpu_s"] >= 0.8 * total["cpu_wait_s"]
    assert total["cpu_wait_outside_share"] < 0.1
    for s in rec["steps"]:  # the oracle: wait less the other threads' CPU, per step
        assert s["cpu_wait_outside_s"] == pytest.approx(
            max(0.0, s["cpu_wait_s"] - s["other_threads_cpu_s"])
        )


def test_a_mostly_sleeping_process_barely_waits() -> None:
    rec = _measure("idle")
    assert rec["total"]["runqueue_share"] is not None
    assert rec["total"]["runqueue_share"] < 0.1
    assert rec["total"]["cpu_wait_share"] < 0.1


def test_totals_are_null_when_a_step_is_unknown() -> None:
    meter = contention.ContentionMeter()
    meter.steps = [
        {
            "step": 0,
            **contention.delta(
                contention.Sample(0.0, 0.0, None, None, "no schedstat"),
                contention.Sample(1.0, 0.5, None, None, "no schedstat"),
            ),
        }
    ]
    total = meter.record(0)["total"]
    assert total["runqueue_s"] is None and total["runqueue_share"] is None  # unknown, not 0
    assert total["wall_s"] == 1.0


def test_written_atomically_into_the_run_folder(tmp_path) -> None:
    contention.write_contention(tmp_path, 3, {"schema": 1})
    assert json.loads(contention.contention_path(tmp_path, 3).read_text()) == {"schema": 1}
    assert sorted(p.name for p in (tmp_path / "contention").iterdir()) == ["rank3.json"]
