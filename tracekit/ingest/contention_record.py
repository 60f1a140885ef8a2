"""contention/rank<R>.json as the analysis reads it: typed once, each figure range-checked.

The file is what the rank measured of itself over its profiled steps (tracekit.capture.contention,
issue #27). A figure the file lacks, or holds as anything but a finite non-negative number, is
None: unknown, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53
    return value if ok else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class ContentionCounts:
    """One rank's CPU contention over its profiled steps."""

    wall_s: float | None
    """Wall time of the profiled steps, seconds."""
    cpu_wait_s: float | None
    """Time the step's own thread was runnable but waited for a CPU (schedstat), seconds."""
    cpu_wait_outside_s: float | None
    """Of cpu_wait_s, the part behind other processes, at least (cpu_wait_s less the CPU time of
    the rank's other threads); None in files from before it was recorded."""
    other_threads_cpu_s: float | None
    """CPU time of the rank's threads other than the step's (gloo, autograd, profiler), seconds."""
    step_waits: tuple[tuple[float, float], ...]
    """Each profiled step's (wall_s, cpu_wait_s), in order; steps lacking either are left out."""
    threads_runqueue_s: float | None
    """Run-queue wait summed over all the rank's threads, seconds (can exceed wall time)."""
    cpu_s: float | None
    """CPU time of the process over the steps, seconds."""
    involuntary_switches: int | None
    """Times the kernel took a CPU away from the rank's threads."""
    usable_cores: int | None
    """CPUs the rank could run on (after pinning)."""
    pinned: bool | None
    """Whether the rank was pinned to its own cores; None when the file does not say."""
    threads: int | None
    """torch's intra-op threads in the rank."""
    local_ranks: int | None
    """Ranks on the rank's machine."""
    machine_cores: int | None
    """CPUs the machine offered the job (before pinning)."""
    unavailable: str | None
    """Why the platform could not give a figure; None when all were read."""
    corun_slowdown: float | None = None
    """The co-run probe's together / alone time per matmul (tracekit.capture.corun); None in
    files from before it, one-rank and GPU runs."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ContentionCounts:
        total = _mapping(data.get("total"))
        steps = data.get("steps")
        steps = steps if isinstance(steps, list) else []
        pairs = []
        for s in steps:
            if isinstance(s, Mapping):
                wall, wait = _seconds(s.get("wall_s")), _seconds(s.get("cpu_wait_s"))
                if wall is not None and wait is not None:
                    pairs.append((wall, wait))
        cores = data.get("usable_cores")
        machine = _mapping(data.get("machine"))
        pinned = data.get("pinned")
        why = data.get("unavailable")
        corun = _mapping(data.get("corun"))
        slowdown = _seconds(corun.get("slowdown"))
        return cls(
            wall_s=_seconds(total.get("wall_s")),
            cpu_wait_s=_seconds(total.get("cpu_wait_s")),
            cpu_wait_outside_s=_seconds(total.get("cpu_wait_outside_s")),
            other_threads_cpu_s=_seconds(total.get("other_threads_cpu_s")),
            step_waits=tuple(pairs),
            threads_runqueue_s=_seconds(total.get("runqueue_s")),
            cpu_s=_seconds(total.get("cpu_s")),
            involuntary_switches=_count(total.get("involuntary_switches")),
            usable_cores=len(cores) if isinstance(cores, list) and cores else None,
            pinned=None if "pinned" not in data else isinstance(pinned, list) and bool(pinned),
            threads=_count(data.get("threads")),
            local_ranks=_count(data.get("local_ranks")),
            machine_cores=_count(machine.get("cores")),
            unavailable=why[:200] if isinstance(why, str) else None,
            # a ratio of two positive times: 0 or above a thousand is no measurement
            corun_slowdown=slowdown if slowdown is not None and 0 < slowdown < 1e3 else None,
        )
