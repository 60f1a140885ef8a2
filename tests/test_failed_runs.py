"""Runs that go wrong, for real (world size 2, 1 profiled step): a rank that raises, one that is
killed (SIGKILL found through /proc), one that hangs until the launcher's timeout. run.json says
what happened, the traces that were written survive, no process is left behind, and
`tracekit analyze` works on what survived (or says clearly that nothing did)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from builders.processes import job_processes
from conftest import run_cli

from tracekit import runfolder
from tracekit.capture.launch import RunOptions, run_job

HANG_REACHED = "rank 1 hangs at step 1 (test hook)"
_REACHED_S: list[float] = []  # seconds a job took to reach the hang (test_killed_rank measures it)


def hang_timeout() -> float:
    """The launcher timeout for the hang test: well past the time a job takes to reach the hang
    on this machine now (measured by the kill test; 60 s if it did not run)."""
    return max(20.0, 2.5 * max(_REACHED_S) + 5) if _REACHED_S else 60.0


def leftover_processes(run: Path) -> list[str]:
    """Live processes (not zombies) whose command line mentions the run folder."""
    return [f"{pid}: {cmd}" for pid, cmd in job_processes(run).items()]


def rank_pid(run: Path, rank: int) -> int | None:
    """The pid of one rank of the job, found under the launcher through /proc (RANK in its environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            str(run).encode() in cmd
            and b"instrumented_runs.dp" in cmd
            and f"RANK={rank}".encode() in env
        ):
            return int(entry.name)
    return None


def analyze_cli(run: Path, tmp_path: Path) -> tuple[object, dict | None]:
    proc = run_cli("analyze", str(run), "--out", str(tmp_path / "analysis"))
    assert "Traceback" not in proc.stderr
    summary = tmp_path / "analysis" / "summary.json"
    return proc, json.loads(summary.read_text()) if summary.is_file() else None


def test_rank_raises_before_any_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_FAIL_RANK", "1")
    monkeypatch.setenv("TRACEKIT_FAIL_STEP", "0")  # the warm-up step: nothing profiled yet
    run = run_job(RunOptions("dp", nproc=2, steps=1, warmup=1, out=tmp_path / "runs"))
    data = runfolder.load_run_json(run)
    assert data["status"] == "failed"
    assert (data["errors"][0]["rank"], data["errors"][0]["kind"]) == (1, "exception")
    assert "injected failure on rank 1 at step 0" in data["errors"][0]["message"]
    assert not runfolder.find_trace_files(run)
    assert not leftover_processes(run)
    proc, summary = analyze_cli(run, tmp_path)
    assert proc.returncode == 2 and summary is None
    line = proc.stderr.strip()
    assert line.startswith(f"tracekit: {run}: no traces in traces/: no rank wrote one")
    assert "the run's status is 'failed': rank 1 exception" in line and "\n" not in line


def test_killed_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 stops in its profiled step; the test SIGKILLs it. Rank 0's collective fails, its
    trace is written; torchrun stops the job; analysis covers rank 0 and names rank 1 missing."""
    monkeypatch.setenv("TRACEKIT_HANG_RANK", "1")
    monkeypatch.setenv("TRACEKIT_HANG_STEP", "1")
    out = tmp_path / "runs"
    box: dict[str, Path] = {}
    job = threading.Thread(
        target=lambda: box.setdefault(
            "run", run_job(RunOptions("dp", nproc=2, steps=1, warmup=1, timeout=240, out=out))
        )
    )
    t0 = time.monotonic()
    job.start()
    pid, deadline = None, time.monotonic() + 200
    while pid is None and time.monotonic() < deadline and job.is_alive():
        logs = sorted(out.glob("dp-*/logs/launcher.log"))
        if logs and HANG_REACHED in logs[-1].read_text(errors="replace"):
            pid = rank_pid(logs[-1].parents[1], 1)
        time.sleep(0.2)
    assert pid is not None, "rank 1 never reached its hang"
    _REACHED_S.append(time.monotonic() - t0)
    os.kill(pid, signal.SIGKILL)
    job.join(timeout=230)
    run = box["run"]
    data = runfolder.load_run_json(run)
    assert data["status"] == "failed"
    root = data["errors"][0]
    assert (root["rank"], root["kind"], root["root_cause"]) == (1, "signal", True)
    assert "SIGKILL" in root["message"]
    assert runfolder.trace_path(run, 0).is_file() and not runfolder.trace_path(run, 1).exists()
    assert not list(runfolder.traces_dir(run).glob(".*")), "no temporary trace left"
    assert not leftover_processes(run)
    proc, summary = analyze_cli(run, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["rank"] for r in summary["ranks"]] == [0]
    assert (
        "rank 1 of world size 2 (run.json) has no trace: the analysis covers rank 0 only"
        in summary["warnings"]
    )
    status = [w for w in summary["warnings"] if w.startswith("the run's status is 'failed'")]
    assert status and "rank 1 signal: stopped by SIGKILL" in status[0]
    assert "rank 1 of world size 2" in proc.stderr.replace("\n", " ")


def test_hanging_rank_hits_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 hangs in its profiled step, rank 0 waits for it in a collective: the launcher's
    timeout stops both; each writes what its profiler recorded on the way out."""
    monkeypatch.setenv("TRACEKIT_HANG_RANK", "1")
    monkeypatch.setenv("TRACEKIT_HANG_STEP", "1")
    timeout = round(hang_timeout())
    run = run_job(
        RunOptions("dp", nproc=2, steps=1, warmup=1, timeout=timeout, out=tmp_path / "runs")
    )
    assert HANG_REACHED in (run / "logs" / "launcher.log").read_text(errors="replace"), (
        f"the job did not reach the hang within the {timeout} s timeout (machine too busy?)"
    )
    data = runfolder.load_run_json(run)
    assert data["status"] == "timeout"
    assert data["errors"][0] == {
        "rank": None,
        "kind": "timeout",
        "message": f"job killed after the {timeout} s timeout",
    }
    stopped = {e["rank"]: e["message"] for e in data["errors"] if e["kind"] == "stopped"}
    assert sorted(stopped) == [0, 1] and all(
        m.startswith("still running when the job was stopped") for m in stopped.values()
    )
    assert not leftover_processes(run)
    traced = sorted(runfolder.rank_from_filename(p.name) for p in runfolder.find_trace_files(run))
    assert traced, "the SIGTERM grace lets at least one rank write its trace"
    proc, summary = analyze_cli(run, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["rank"] for r in summary["ranks"]] == traced
    assert any(w.startswith("the run's status is 'timeout'") for w in summary["warnings"])
    if traced != [0, 1]:
        assert any("has no trace" in w for w in summary["warnings"])
