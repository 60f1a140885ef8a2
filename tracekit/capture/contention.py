"""CPU contention of one process, read from /proc (issue #27): how long its threads were runnable
but waited for a CPU, how often the kernel took a CPU away from them, CPU time against wall time,
and the cores it may use.

Torch-free on purpose: the launcher and the ranks both use it, and the launcher must not import
torch. Where the platform lacks a figure (no /proc, no schedstat, no sched_getaffinity) the figure
is None and ``unavailable`` says why: unknown is null, never 0.

    meter = ContentionMeter()
    with meter.step(k): ...          # each step; steps >= warmup are the profiled ones
    meter.record(warmup)             # -> contention/rank<R>.json (see :func:`write_contention`)
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.runfolder import contention_path

SCHEMA = 1


@dataclass(frozen=True)
class Sample:
    """The process's counters at one instant; None: not readable here (``why`` says why)."""

    wall_s: float
    cpu_s: float
    runqueue_s: float | None  # sum over threads of schedstat field 2 (ns waiting on a run queue)
    involuntary: int | None  # sum over threads of nonvoluntary_ctxt_switches
    why: str | None = None
    step_thread_s: float | None = None  # the sampling thread's own run-queue wait, seconds
    step_thread_cpu_s: float | None = None  # the sampling thread's own time on a CPU, seconds


def _task_dirs(pid: str) -> list[Path]:
    # a thread can end between listdir and open: the caller skips what vanished
    return sorted(Path(f"/proc/{pid}/task").iterdir())


def _runqueue_ns(tasks: list[Path]) -> int:
    total = 0
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        total += int(fields[1])
    return total


def _involuntary(tasks: list[Path]) -> int:
    total = 0
    for task in tasks:
        try:
            text = (task / "status").read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            if line.startswith("nonvoluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def _own_schedstat_s() -> tuple[float | None, float | None]:
    """The calling thread's (the step's) time on a CPU and run-queue wait, seconds."""
    try:
        on_cpu, waited = Path("/proc/thread-self/schedstat").read_text().split()[:2]
        return int(on_cpu) / 1e9, int(waited) / 1e9
    except (OSError, IndexError, ValueError):
        return None, None


def sample(pid: str = "self") -> Sample:
    """The counters of process ``pid`` now (all its threads; the calling thread's own wait)."""
    wall, cpu = time.perf_counter(), time.process_time()
    own_cpu, own = _own_schedstat_s() if pid == "self" else (None, None)
    try:
        tasks = _task_dirs(pid)
        runqueue: float | None = _runqueue_ns(tasks) / 1e9
    except (OSError, IndexError, ValueError) as exc:
        # no /proc (macOS), or a kernel without CONFIG_SCHED_INFO: schedstat missing or empty
        return Sample(wall, cpu, None, _rusage_involuntary(), f"no per-thread schedstat: {exc}")
    try:
        involuntary: int | None = _involuntary(tasks)
    except (OSError, ValueError):
        involuntary = _rusage_involuntary()
    return Sample(wall, cpu, runqueue, involuntary, step_thread_s=own, step_thread_cpu_s=own_cpu)


def _rusage_involuntary() -> int | None:
    try:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)
    except (OSError, AttributeError):
        return None


def usable_cores() -> list[int] | None:
    """The CPUs this process may run on; None where the platform cannot say."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return None if getaffinity is None else sorted(getaffinity(0))


def delta(a: Sample, b: Sample) -> dict[str, Any]:
    """What happened between samples ``a`` and ``b``: seconds, and the run-queue share of wall."""
    wall = b.wall_s - a.wall_s
    rq = None if a.runqueue_s is None or b.runqueue_s is None else b.runqueue_s - a.runqueue_s
    inv = None if a.involuntary is None or b.involuntary is None else b.involuntary - a.involuntary
    own = (
        None
        if a.step_thread_s is None or b.step_thread_s is None
        else b.step_thread_s - a.step_thread_s
    )
    cpu = b.cpu_s - a.cpu_s
    others = (
        None
        if a.step_thread_cpu_s is None or b.step_thread_cpu_s is None
        else max(0.0, cpu - (b.step_thread_cpu_s - a.step_thread_cpu_s))
    )
    # while the step thread waited, a CPU ran either the rank's other threads (its gloo, autograd
    # and profiler threads: the rank's own work, in turn instead of overlapped) or another
    # process; the others ran at most `others` seconds, so at least own - others was behind
    # other processes (a lower bound: what inflates the run from outside)
    outside = None if own is None or others is None else max(0.0, own - others)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "other_threads_cpu_s": others,
        "cpu_wait_outside_s": outside,
        "runqueue_s": rq,
        # run-queue delay is summed over threads, so with several runnable threads the share
        # can exceed 1: it is "CPU-seconds wanted but not given" per second of the window
        "runqueue_share": None if rq is None or wall <= 0 else rq / wall,
        "involuntary_switches": inv,
        # the step's own thread, runnable but not running: at most the step's wall time, so
        # its share is the part of the step that did not progress for want of a CPU
        "cpu_wait_s": own,
        "cpu_wait_share": None if own is None or wall <= 0 else own / wall,
        "cpu_wait_outside_share": None if outside is None or wall <= 0 else outside / wall,
    }


class ContentionMeter:
    """Samples the process around each step (a harness StepMeter-like hook)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.first: Sample | None = None
        self.last: Sample | None = None
        self.why: str | None = None

    @contextmanager
    def step(self, k: int) -> Iterator[None]:
        a = sample()
        try:
            yield
        finally:
            self.between(k, a, sample())

    def between(self, k: int, a: Sample, b: Sample) -> None:
        """Step ``k`` ran from sample ``a`` to sample ``b``."""
        self.why = self.why or a.why or b.why
        self.steps.append({"step": k, **delta(a, b)})

    def record(self, warmup: int, end: int | None = None) -> dict[str, Any]:
        """contention/rank<R>.json's content: the profiled steps (``warmup`` <= k, and k <
        ``end`` when given) and totals."""
        profiled = [
            s for s in self.steps if s["step"] >= warmup and (end is None or s["step"] < end)
        ]

        def total(key: str) -> float | None:
            values = [s[key] for s in profiled]
            return None if not values or any(v is None for v in values) else sum(values)

        wall, rq, own = total("wall_s"), total("runqueue_s"), total("cpu_wait_s")
        outside = total("cpu_wait_outside_s")
        return {
            "schema": SCHEMA,
            "pid": os.getpid(),
            "usable_cores": usable_cores(),
            "steps": profiled,
            "total": {
                "wall_s": wall,
                "cpu_s": total("cpu_s"),
                "runqueue_s": rq,
                "runqueue_share": None if rq is None or not wall else rq / wall,
                "involuntary_switches": total("involuntary_switches"),
                "cpu_wait_s": own,
                "cpu_wait_share": None if own is None or not wall else own / wall,
                "other_threads_cpu_s": total("other_threads_cpu_s"),
                "cpu_wait_outside_s": outside,
                "cpu_wait_outside_share": None if outside is None or not wall else outside / wall,
            },
            "unavailable": self.why,
        }


def write_contention(run: Path, rank: int, data: dict[str, Any]) -> None:
    """Atomically (no half-written file for ingest to trip on)."""
    path = contention_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def pin_cores(rank: int, local_ranks: int) -> list[int] | None:
    """Pin this rank to its own share of the usable cores when there are at least as many cores
    as ranks, so the ranks stop taking each other's CPU; returns the cores, or None (not pinned:
    too few cores, or no sched_setaffinity on this platform)."""
    cores = usable_cores()
    setaffinity = getattr(os, "sched_setaffinity", None)
    if cores is None or setaffinity is None or len(cores) < local_ranks or local_ranks < 1:
        return None
    per = len(cores) // local_ranks
    mine = cores[rank * per : (rank + 1) * per]
    setaffinity(0, mine)
    return mine


def machine() -> dict[str, Any]:
    """The launcher's view: cores and load (run.json "contention")."""
    try:
        load: list[float] | None = list(os.getloadavg())
    except (OSError, AttributeError):
        load = None
    cores = usable_cores()
    return {
        "cores": None if cores is None else len(cores),
        "cpu_count": os.cpu_count(),
        "loadavg": load,
    }
