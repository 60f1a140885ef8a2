"""run.json as the ranks of a profiled job share it: read-modify-write under a bounded lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit import runfolder


class ProfileWarning(UserWarning):
    """Something about the job that makes its trace less useful (oversubscription, no logs)."""


LOCK_WAIT_S = 30.0  # a holder writes a few kB: longer, it is stuck (SIGSTOP, a hung NFS)


def update_run_json(
    run: Path, change: Callable[[dict[str, Any]], None], wait_s: float = LOCK_WAIT_S
) -> None:
    """Read-modify-write run.json under a lock, so a failing rank and rank 0 never clobber
    each other's entries (flock: best effort on network file systems); the lock is waited for
    at most ``wait_s``, then the update goes ahead unlocked with a warning."""
    fd = os.open(run, os.O_RDONLY)  # flock on the run folder itself: no lock file left behind
    try:
        _lock(fd, run, wait_s)
        try:
            data = runfolder.load_run_json(run) or {}
        except Exception:  # noqa: BLE001 - a damaged run.json is rewritten, never fatal here
            data = {}
        change(data)
        runfolder.write_json_atomic(runfolder.run_json_path(run), data)
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, run: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(BlockingIOError):
            return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        time.sleep(0.05)
    warnings.warn(f"{run}: run.json locked {wait_s:g} s; updated unlocked", ProfileWarning, 4)
