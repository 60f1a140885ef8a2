"""Supervising a job's processes: signals, stopping every process of the job, copying its output.

A job is torchrun's agents and their ranks, each in a session of its own; they are found through
/proc (the descendants of each agent, and every process whose environment carries the job's
token, :data:`JOB_ENV`: a rank whose torchrun is gone is no one's descendant but still ours),
and a process is signalled only while its start time is still the one recorded (a reused pid is
left alone). Stopping is SIGTERM to everyone, a grace period in which ranks write what their
profiler recorded, then SIGKILL (:func:`kill_job`); a second signal to the launcher cuts the
grace short (:func:`hurry_on_signals`), it never leaves the job half-stopped.

Every process of the job also dies with its parent (:func:`die_with_parent`, Linux'
PR_SET_PDEATHSIG): torchrun when the launcher is killed outright, a rank when its torchrun is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol, TextIO

KILL_GRACE_S = 5.0
REAP_S = 10.0  # after SIGKILL: a process in uninterruptible sleep is left, not awaited forever
#: the job's token in every process of a job (torchrun and its ranks inherit it); the launcher
#: stops exactly the processes that carry its token, and a rank checks its parent carries it
JOB_ENV = "TRACEKIT_JOB"
_PR_SET_PDEATHSIG = 1
# loaded here, in the launcher: die_with_parent runs between fork and exec too, where loading a
# library (dlopen's lock, the import lock, maybe held by another thread at the fork) could hang
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
PEER_GRACE_S = 20.0  # emulated nodes: time the others get to exit after one node's agent failed


class Sink(Protocol):
    """Where the job's output is copied: a text stream, or anything that writes and flushes."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


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


def kill_descendants(root: int) -> None:
    """SIGKILL every live descendant of ``root`` (each checked by its start time)."""
    for pid, start in _descendants(root):
        _signal(pid, signal.SIGKILL, start)


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


def _environ_has(pid: int, item: bytes) -> bool:
    try:
        return item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read: never one of our job's
        return False


def carriers(token: str) -> list[tuple[int, str | None]]:
    """(pid, start time) of every live process whose environment carries the job's token."""
    item = f"{JOB_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            start = _proc_start_time(pid)
            if _environ_has(pid, item) and _alive(pid, start):
                found.append((pid, start))
    return found


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (PR_SET_PDEATHSIG;
    kept across exec). ``parent``: the pid it must still have, else it is gone already and
    ``sig`` is sent now. Linux only; elsewhere nothing (False)."""
    if _LIBC is None:
        return False
    try:
        ok = _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except AttributeError:  # a libc without prctl
        return False
    if ok and parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)  # the parent died before the request: it would never come
    return ok


def parent_of_job(token: str) -> bool:
    """This process's parent is still a process of the job ``token`` (a rank: its torchrun)."""
    return _environ_has(os.getppid(), f"{JOB_ENV}={token}".encode())


def kill_job(
    proc: subprocess.Popen | None,
    token: str | None = None,
    hurry: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """SIGTERM torchrun and every rank (each in a session of its own; with ``token``, also every
    process carrying it, though no longer torchrun's child); SIGKILL what is left after a grace
    period (ranks use it to write what their profiler recorded), or as soon as ``hurry`` is set.
    Returns one run.json error per rank that was still running: stopped by SIGTERM, or killed."""
    members = [] if proc is None else [(proc.pid, _proc_start_time(proc.pid))]
    members += _descendants(proc.pid) if proc is not None else []
    members += [m for m in carriers(token) if m not in members] if token else []
    ranks = {pid: _env_rank(pid) for pid, _ in members if pid != getattr(proc, "pid", None)}
    for pid, start in members:
        _signal(pid, signal.SIGTERM, start)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in members):
        if proc is not None:
            proc.poll()  # reap torchrun so that its pid does not linger as a zombie
        if hurry is not None and hurry.is_set():
            break
        time.sleep(0.05)
    stubborn = {pid for pid, start in members if _alive(pid, start)}
    for pid, start in members:
        _signal(pid, signal.SIGKILL, start)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(REAP_S)
    return [
        {
            "rank": r,
            "kind": "stopped",
            "message": "still running when the job was stopped: "
            + (
                "killed (SIGKILL)"
                + (
                    ""
                    if hurry is not None and hurry.is_set()
                    else f" after ignoring SIGTERM for {KILL_GRACE_S:g} s"
                )
                if pid in stubborn
                else "exited on SIGTERM"
            ),
        }
        for pid, r in sorted(ranks.items(), key=lambda kv: kv[1] if kv[1] is not None else -1)
        if r is not None
    ]


def pump(stream: TextIO, sinks: list[Sink], keep: list[str]) -> None:
    """Copy the job's output, line by line, to every sink and keep it for parsing."""
    for line in stream:
        keep.append(line)
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass


def wait_all(
    procs: list[subprocess.Popen], timeout: float | None, token: str | None = None
) -> None:
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
                    kill_job(p, token)
        time.sleep(0.1)


def on_signals(
    handler: Any, int_handler: Any = signal.default_int_handler
) -> dict[signal.Signals, Any]:
    """Install ``handler`` for SIGTERM and SIGHUP, and ``int_handler`` (Python's own unless
    given) for SIGINT (main thread only); the previous handlers.

    SIGINT too: importing polars installs a SIGINT handler of its own with SA_RESTART, under
    which Ctrl-C never interrupted waiting for the job (signal.signal installs without it). The
    wait itself also polls (wait_all), so a handler installed later cannot block it either.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, int_handler)
    return previous


def hurry_on_signals(hurry: threading.Event) -> None:
    """From now on SIGINT, SIGTERM and SIGHUP only set ``hurry`` (main thread only):
    while the launcher stops the job and writes run.json, a second Ctrl-C (or ``timeout``'s
    re-sent SIGINT) shortens the grace period instead of leaving the job half-stopped. The
    caller restores the handlers (:func:`on_signals` returned them)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: hurry.set())
