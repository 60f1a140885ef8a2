"""tracekit.capture.torchrun_agent bounds how long torchrun outlives a launcher killed outright
(SIGKILL): torch 2.13's torchrun was measured hanging at exit forever (its log-copying threads
never stopped) in 1 of 3 such kills. Here the agent runs a module that hangs the same way (a
non-daemon thread that never ends) and keeps a child of its own; its launcher, a real process,
is SIGKILLed: the agent and its child are gone within KILL_GRACE_S and a margin. The same module
run without the agent is still alive then (the oracle that the hang is real)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import ROOT

from tracekit.capture import supervise

MARGIN_S = 5.0  # the watchdog's poll, /proc walks, a loaded machine

HANGS_AT_EXIT = """
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
threading.Thread(target=time.sleep, args=(600,)).start()  # non-daemon: exit waits for it
"""

LAUNCHER = """
import subprocess, sys, time
subprocess.Popen(sys.argv[1:])
time.sleep(600)
"""


Member = tuple[int, str | None]  # (pid, start time): a reused pid is never taken for it


def _launch(tmp_path: Path, agent: bool) -> tuple[subprocess.Popen, list[Member]]:
    """A launcher running the hanging module (through the agent or not); what it started (the
    module's process and the module's child), once the child is up."""
    (tmp_path / "hangs_at_exit.py").write_text(textwrap.dedent(HANGS_AT_EXIT))
    out = tmp_path / "pids.txt"
    via = ["-m", "tracekit.capture.torchrun_agent"] if agent else ["-m"]
    command = [sys.executable, *via, "hangs_at_exit"]
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *command],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        stdout=out.open("w"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not out.read_text().strip():
        assert time.monotonic() < deadline and launcher.poll() is None, "the module never started"
        time.sleep(0.1)
    members = supervise._descendants(launcher.pid)  # the module and its child
    assert len(members) == 2, members
    return launcher, members


def _gone_after_launcher_killed(launcher: subprocess.Popen, members: list[Member]) -> bool:
    launcher.kill()
    launcher.wait(10)
    deadline = time.monotonic() + supervise.KILL_GRACE_S + MARGIN_S
    while time.monotonic() < deadline and any(supervise._alive(*m) for m in members):
        time.sleep(0.1)
    return not any(supervise._alive(*m) for m in members)


def test_the_agent_outlives_a_killed_launcher_by_a_bounded_time(tmp_path: Path) -> None:
    launcher, members = _launch(tmp_path, agent=True)
    try:
        assert _gone_after_launcher_killed(launcher, members), "agent or its child still alive"
    finally:
        for member in members:
            supervise._signal(member[0], signal.SIGKILL, member[1])


def test_without_the_agent_the_module_hangs(tmp_path: Path) -> None:
    launcher, members = _launch(tmp_path, agent=False)
    try:
        assert not _gone_after_launcher_killed(launcher, members), (
            "the oracle's hang never happened"
        )
    finally:
        for member in members:
            supervise._signal(member[0], signal.SIGKILL, member[1])
