"""Run a command and measure its whole process tree: wall time, CPU time, peak memory.

- wall: ``time.perf_counter`` around start to exit.
- CPU: user + system seconds of the child and every descendant it (or they) waited for,
  from ``getrusage(RUSAGE_CHILDREN)`` before and after (worker pools reap their workers, so
  their time is in it); the sampled per-process times below are a cross-check.
- peak RSS: every ~20 ms the tree is walked through /proc (ppid links) and the resident sets
  of its processes summed (``/proc/<pid>/statm``); the peak of those sums. Shared pages (a
  library mapped by a parent and its forked or spawned workers) count once per process, as
  ``ps`` shows them; ``peak_pss`` (proportional set size, shared pages split among sharers,
  from ``/proc/<pid>/smaps_rollup``) is sampled every 5th tick as the fairer second view.
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    wall_s: float
    cpu_s: float
    peak_rss: int
    peak_pss: int
    returncode: int
    stdout: str
    stderr: str
    max_procs: int
    sampled_cpu_s: float
    extra: dict = field(default_factory=dict)


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, user+sys seconds) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rindex(b")") + 2 :].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICKS


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class _TreeSampler(threading.Thread):
    """Samples the process tree under ``root`` until stopped."""

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.stop = threading.Event()
        self.parent: dict[int, int] = {}  # pid -> ppid, read once per pid
        self.cpu: dict[int, float] = {}  # last seen user+sys of tree members
        self.peak_rss = self.peak_pss = self.max_procs = 0

    def _tree(self) -> list[int]:
        pids = set()
        for name in os.listdir("/proc"):
            if name.isdigit():
                pid = int(name)
                pids.add(pid)
                if pid not in self.parent:
                    st = _stat(pid)
                    if st is not None:
                        self.parent[pid] = st[0]
        for gone in set(self.parent) - pids:
            del self.parent[gone]
        members, frontier = [self.root], [self.root]
        children: dict[int, list[int]] = {}
        for pid, ppid in self.parent.items():
            children.setdefault(ppid, []).append(pid)
        while frontier:
            nxt = [c for p in frontier for c in children.get(p, ())]
            members += nxt
            frontier = nxt
        return members

    def run(self) -> None:
        tick = 0
        while not self.stop.is_set():
            members = self._tree()
            self.peak_rss = max(self.peak_rss, sum(_rss(p) for p in members))
            if tick % 5 == 0:
                self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in members))
            self.max_procs = max(self.max_procs, len(members))
            for p in members:
                st = _stat(p)
                if st is not None:
                    self.cpu[p] = st[1]
            tick += 1
            self.stop.wait(self.interval)


def run(
    cmd: list[str],
    *,
    cwd: Path | None = None,
    env: dict | None = None,
    interval: float = 0.02,
    timeout: float = 1800,
) -> Sample:
    """Run ``cmd`` to completion and measure it (see the module docstring)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}-{time.monotonic_ns()}"
    with open(f"{out_path}.out", "w+") as out, open(f"{out_path}.err", "w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        sampler = _TreeSampler(proc.pid, interval)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").unlink(missing_ok=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(
        wall_s=wall,
        cpu_s=cpu,
        peak_rss=sampler.peak_rss,
        peak_pss=sampler.peak_pss,
        returncode=rc,
        stdout=stdout,
        stderr=stderr,
        max_procs=sampler.max_procs,
        sampled_cpu_s=sum(sampler.cpu.values()),
    )
