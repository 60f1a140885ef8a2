"""Supervising a job's processes: signals, stopping every process of the job, copying its output.

A job is torchrun's agents and their ranks, each in a session of its own; they are found through
/proc (the descendants of each agent), and a process is signalled only while its start time is
still the one recorded (a reused pid is left alone). Stopping is SIGTERM to everyone, a grace
period in which ranks write what their profiler recorded, then SIGKILL (:func:`kill_job`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, TextIO

KILL_GRACE_S = 5.0
PEER_GRACE_S = 20.0  # emulated nodes: time the others get to exit after one node's agent failed


class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP to the launcher: handled like Ctrl-C (the job is stopped, run.json written)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    """The same process (same start time) still exists and is not a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[19] == start and fields[0] not in ("Z", "X")


def _descendants(root: int) -> list[tuple[int, str | None]]:
    """(pid, start time) of every live descendant of ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append((child, _proc_start_time(child)))
            todo.append(child)
    return found


def _signal(pid: int, sig: int, start: str | None = None) -> None:
    """Signal a process (its whole group when it leads one), if it is still the same process."""
    if start is not None and _proc_start_time(pid) != start:
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _env_rank(pid: int) -> int | None:
    """RANK in a live process's environment (torchrun sets it for each rank), else None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK=") and item[5:].isdigit():
            return int(item[5:])
    return None


def kill_job(proc: subprocess.Popen) -> list[dict[str, Any]]:
    """SIGTERM torchrun and every rank (each in a session of its own); SIGKILL what is left after
    a grace period (ranks use it to write what their profiler recorded). Returns one run.json
    error per rank that was still running: stopped by SIGTERM, or killed after the grace."""
    members = [(proc.pid, _proc_start_time(proc.pid)), *_descendants(proc.pid)]
    ranks = {pid: _env_rank(pid) for pid, _ in members}
    for pid, start in members:
        _signal(pid, signal.SIGTERM, start)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in members):
        proc.poll()  # reap torchrun so that its pid does not linger as a zombie
        time.sleep(0.05)
    stubborn = {pid for pid, start in members if _alive(pid, start)}
    for pid, start in members:
        _signal(pid, signal.SIGKILL, start)
    proc.wait()
    return [
        {
            "rank": r,
            "kind": "stopped",
            "message": "still running when the job was stopped: "
            + (
                f"killed (SIGKILL) after ignoring SIGTERM for {KILL_GRACE_S:g} s"
                if pid in stubborn
                else "exited on SIGTERM"
            ),
        }
        for pid, r in sorted(ranks.items(), key=lambda kv: kv[1] if kv[1] is not None else -1)
        if r is not None
    ]


def pump(stream: TextIO, sinks: list[TextIO], keep: list[str]) -> None:
    """Copy the job's output, line by line, to every sink and keep it for parsing."""
    for line in stream:
        keep.append(line)
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass


def wait_all(procs: list[subprocess.Popen], timeout: float | None) -> None:
    """Wait for every agent; raise TimeoutExpired after ``timeout`` s. When one exits with an
    error, the others (other emulated nodes) get PEER_GRACE_S to follow, then are stopped.
    Polls every 0.1 s: a blocking waitpid under a SIGINT handler with SA_RESTART never comes
    back to Python for Ctrl-C."""
    t0, failed_at = time.monotonic(), None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if timeout is not None and now - t0 > timeout:
            raise subprocess.TimeoutExpired(procs[0].args, timeout)
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = now
        if failed_at is not None and now - failed_at > PEER_GRACE_S:
            for p in procs:
                if p.poll() is None:
                    kill_job(p)
        time.sleep(0.1)


def on_signals(handler: Any) -> dict[int, Any]:
    """Install ``handler`` for SIGTERM and SIGHUP, and Python's own for SIGINT (main thread
    only); the previous handlers.

    SIGINT too: importing polars installs a SIGINT handler of its own with SA_RESTART, under
    which Ctrl-C never interrupted waiting for the job (signal.signal installs without it). The
    wait itself also polls (wait_all), so a handler installed later cannot block it either.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    return previous
