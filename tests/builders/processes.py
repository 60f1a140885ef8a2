"""The processes of a job, found by what their command line names (for tests that kill a job)."""

from __future__ import annotations

import os
from pathlib import Path


def job_processes(folder: Path, but: int | None = None) -> dict[int, str]:
    """Live processes (not zombies) whose command line names ``folder``, but this one and
    ``but``: pid -> the command line's first 160 characters."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), but):
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(folder) in cmd and state not in ("Z", "X"):
            found[int(entry.name)] = cmd[:160]
    return found
