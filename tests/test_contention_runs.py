"""The contention section on real runs (#27): a 2-rank dp job whose every core also runs a busy
process waits for a CPU, and the analysis says so; the oracle is each rank's own file.

Behaviour, not timing bounds: a rank pinned to a core it shares with a busy loop is runnable
but not running a large part of the time (the scheduler splits the core between them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tracekit import runfolder

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/thread-self/schedstat"),
        reason="needs Linux schedstat and sched_setaffinity",
    ),
]
_HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


@contextmanager
def _busy_cores() -> Iterator[None]:
    hogs = [subprocess.Popen([sys.executable, "-c", _HOG, str(c)]) for c in os.sched_getaffinity(0)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait(timeout=30)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_ranks_sharing_their_cores_are_named_with_their_share(tmp_path: Path) -> None:
    with _busy_cores():
        done = _cli("run", "dp", "--nproc", "2", "--steps", "5", "--out", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    files = {r: json.loads(runfolder.contention_path(run, r).read_text()) for r in (0, 1)}
    analysed = _cli("analyze", str(run), "--out", str(tmp_path / "an"), "--no-cache")
    assert analysed.returncode == 0, analysed.stderr[-3000:]
    summary = json.loads((tmp_path / "an" / "summary.json").read_text())
    c = summary["contention"]
    for row in c["per_rank"]:
        total = files[row["rank"]]["total"]  # the oracle: what the rank measured
        assert row["cpu_wait_share"] == pytest.approx(total["cpu_wait_s"] / total["wall_s"])
        assert 0 <= row["cpu_wait_s"] <= row["wall_s"]
    # a busy loop on every core: each rank waits for its core a large part of its steps
    assert c["inflated"] == [0, 1], c
    line = next(w for w in summary["warnings"] if w.startswith("contention: "))
    assert "rank(s) 0 (" in line and ", 1 (" in line and "include that waiting" in line
    assert line in analysed.stdout + analysed.stderr  # the CLI says it too
