"""tracekit.profile's contention record (issue #27 for a user's own job): what the reference
runs' contention hook records around each step, here between ``prof.step()`` calls.

Each step (from one ``step()`` to the next; the first from the profiler's start) is sampled from
/proc (tracekit.capture.contention: CPU wait of the step's thread, of the rank's other threads,
involuntary switches); the file keeps the steps the trace holds, the active steps of its latest
cycle, so the analysis puts the rank's CPU wait beside that very window. On a CPU job of a few
ranks the co-run probe (tracekit.capture.corun: 0.2 s per rank and 0.2 s more) runs once at
the start.
Nothing is pinned: a user's job keeps the placement it chose.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from tracekit.capture import contention, corun

#: the co-run probe's turns grow with the ranks: past this many it is left out (None)
CORUN_MAX_RANKS = 8


class StepContention:
    """Samples the process at each step boundary; :meth:`write` records the traced steps."""

    def __init__(self, group: Any, device: str, world_size: int) -> None:
        self.machine = contention.machine()
        self.corun: dict[str, Any] | None = None
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and 1 < world_size <= CORUN_MAX_RANKS:
            self.corun = corun.measure(group, torch.device(device.split(":")[0]))
        self.meter = contention.ContentionMeter()
        self._last = contention.sample()

    def end(self, k: int) -> None:
        """Step ``k`` (0-based) ended now (before the profiler's own step)."""
        self.meter.between(k, self._last, contention.sample())

    def begin(self) -> None:
        """The next step begins now (after the profiler's step: its cost, and the trace's
        export at a cycle's end, belong to no step, as in the trace's ProfilerStep spans)."""
        self._last = contention.sample()

    def write(self, run: Any, rank: int, traced: range) -> None:
        """contention/rank<R>.json for the steps in ``traced`` (those the trace holds)."""
        data = self.meter.record(traced.start, traced.stop)
        data.update(
            threads=torch.get_num_threads(),
            local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            pinned=False,
            machine=self.machine,
            corun=self.corun,
            loadavg_after=contention.machine()["loadavg"],
        )
        contention.write_contention(run, rank, data)


def traced_steps(schedule: dict[str, int], cycles: int, steps: int) -> range:
    """The step indices the trace holds: the active steps of the latest cycle written (one cut
    short holds those taken); empty before any."""
    if cycles < 1:
        return range(0)
    period = schedule["wait"] + schedule["warmup"] + schedule["active"]
    lo = (cycles - 1) * period + schedule["wait"] + schedule["warmup"]
    return range(lo, min(lo + schedule["active"], steps))
