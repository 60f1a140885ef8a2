"""The processes of a `tracekit run` job on every way out (issue #24 item 5), for real: a 2-rank
gloo dp job, long enough (400 steps) that a rank left behind would still be training, stopped by
two Ctrl-C 0.02 s apart, by `timeout -s INT` (which sends its SIGINT twice: to tracekit and to
its process group), by SIGKILL of torchrun and by SIGKILL of tracekit itself. Afterwards no
process of the job is alive (found through /proc: every process whose command line names the
run folder) within BOUND_S, and run.json says how it ended, once, and still says it later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from builders.processes import job_processes
from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow(reason="tracekit run dp jobs, stopped every way")

BOUND_S = 15.0  # every process of the job gone this long after the blow (KILL_GRACE_S is 5 s)
START_S = 240.0  # a loaded machine takes a while to import torch twice


def start(out: Path, prefix: list[str] | None = None) -> tuple[subprocess.Popen, Path]:
    """`tracekit run dp --nproc 2 --steps 400`, in a session of its own (like a shell's job),
    returned once rank 0 has trained a step; its stderr is written to a file (never blocks)."""
    err = out / "stderr.txt"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "tracekit.cli", "run", "dp", "--nproc", "2"]
            + ["--steps", "400", "--out", str(out / "runs")],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_S
    while "] step 0 " not in err.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc, out)
            pytest.fail(f"the job never trained a step:\n{err.read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, err


def _stop(proc: subprocess.Popen, out: Path) -> None:
    """Clean up after a failed test: whatever is left of the job is killed."""
    for pid in [proc.pid, *job_processes(out)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)


def settled(proc: subprocess.Popen, out: Path, tracekit_too: bool = True) -> dict[int, str]:
    """Wait up to BOUND_S for tracekit (if ``tracekit_too``) and every process of the job to be
    gone; what is still alive."""
    deadline = time.monotonic() + BOUND_S
    left = job_processes(out, but=proc.pid)
    while time.monotonic() < deadline:
        left = job_processes(out, but=proc.pid)
        if not left and (not tracekit_too or proc.poll() is not None):
            break
        time.sleep(0.2)
    return left


def run_json(out: Path) -> dict:
    (run,) = (out / "runs").iterdir()
    return json.loads((run / "run.json").read_text())


def not_job_output(stderr: IO[str] | str) -> list[str]:
    """tracekit's own lines: not the ranks' ([default0]:...), not its first line, not blank."""
    text = stderr if isinstance(stderr, str) else stderr.read()
    return [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith(("[default", "tracekit: dp on 2 ranks"))
    ]


def interrupted_cleanly(proc: subprocess.Popen, out: Path, err: Path) -> None:
    try:
        left = settled(proc, out)
        assert proc.poll() is not None, f"tracekit still running {BOUND_S:g} s after SIGINT"
        assert left == {}, f"processes of the job still alive {BOUND_S:g} s after: {left}"
    finally:
        _stop(proc, out)
    assert proc.returncode == 130, err.read_text()[-3000:]
    # one line, not torchrun's traceback when it gets our SIGTERM (logs/ keeps that)
    assert not_job_output(err.read_text()) == ["tracekit: interrupted"], err.read_text()[-3000:]
    doc = run_json(out)
    assert doc["status"] == "interrupted", doc["errors"]
    time.sleep(5)  # a rank left training would rewrite it as ok
    assert run_json(out)["status"] == "interrupted"


def test_two_ctrl_c_stop_every_process(tmp_path: Path) -> None:
    proc, err = start(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C, twice
    time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    interrupted_cleanly(proc, tmp_path, err)


def test_one_ctrl_c_is_one_line(tmp_path: Path) -> None:
    proc, err = start(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    interrupted_cleanly(proc, tmp_path, err)
    assert "Traceback" not in err.read_text()
    (run,) = (tmp_path / "runs").iterdir()
    assert "SignalException" in (run / "logs" / "launcher.log").read_text()  # kept, not shown


def test_timeout_s_int_stops_every_process(tmp_path: Path) -> None:
    """GNU timeout sends SIGINT to tracekit, then to its own process group (tracekit again)."""
    proc, err = start(tmp_path, ["timeout", "-s", "INT", "1000"])
    os.kill(proc.pid, signal.SIGINT)  # timeout passes it on the same way as when time is up
    try:
        left = settled(proc, tmp_path)
        assert proc.poll() is not None and left == {}, left
    finally:
        _stop(proc, tmp_path)
    assert proc.returncode == 130, err.read_text()[-3000:]  # timeout passes tracekit's status on
    assert not_job_output(err.read_text()) == ["tracekit: interrupted"], err.read_text()[-3000:]
    assert run_json(tmp_path)["status"] == "interrupted"


def torchrun_pid(out: Path) -> int:
    (pid,) = [p for p, cmd in job_processes(out).items() if "torch.distributed.run" in cmd]
    return pid


def test_a_killed_torchrun_takes_its_ranks_with_it(tmp_path: Path) -> None:
    proc, err = start(tmp_path)
    os.kill(torchrun_pid(tmp_path), signal.SIGKILL)
    try:
        left = settled(proc, tmp_path)
        assert proc.poll() is not None and left == {}, left
    finally:
        _stop(proc, tmp_path)
    assert proc.returncode == 1, err.read_text()[-3000:]
    doc = run_json(tmp_path)
    assert doc["status"] == "failed"
    assert "torchrun was killed by SIGKILL" in doc["errors"][0]["message"], doc["errors"]
    time.sleep(5)
    assert run_json(tmp_path)["status"] == "failed"  # no rank left to say ok


def test_a_killed_tracekit_takes_the_job_with_it(tmp_path: Path) -> None:
    proc, _ = start(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    try:
        assert settled(proc, tmp_path) == {}
    finally:
        _stop(proc, tmp_path)
    # nobody was left to know how it ended: run.json says running, and analyze says so
    assert run_json(tmp_path)["status"] == "running"
    (run,) = (tmp_path / "runs").iterdir()
    if not list((run / "traces").glob("rank*.json.gz")):
        pytest.skip("the ranks were stopped before they wrote a trace: nothing to analyse")
    done = run_cli("analyze", str(run), "--out", str(tmp_path / "analysis"), timeout=300)
    assert "it never finished" in done.stderr, done.stderr[-2000:]


def test_a_stuck_lock_holder_never_blocks_a_run_json_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds run.json's lock and never lets go (a rank stopped by SIGSTOP): the
    update waits LOCK_WAIT_S, then goes ahead unlocked with a warning."""
    from tracekit.capture import run_json_update

    (tmp_path / "run.json").write_text('{"status": "running"}')
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(tmp_path)!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        t0 = time.monotonic()
        with pytest.warns(run_json_update.ProfileWarning, match="updated unlocked"):
            run_json_update.update_run_json(
                tmp_path, lambda d: d.update(status="failed"), wait_s=1.0
            )
        assert time.monotonic() - t0 < 30
    finally:
        holder.kill()
        holder.wait(30)
    assert run_json_at(tmp_path)["status"] == "failed"


def run_json_at(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())
