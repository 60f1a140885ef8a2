"""summary.json ``contention`` and ``steps``: how far a run's own timings can be trusted (#27).

``contention``: what each rank of one of our runs measured of itself (contention/rank<R>.json,
tracekit.capture.contention): the time its step thread was runnable but waited for a CPU
(Linux schedstat), against the profiled steps' wall time. On a machine with fewer cores than
ranks x threads that waiting is inside every compute and bubble figure of the summary.
``steps``: the job's step time over the profiled steps, with its spread: a difference between
runs smaller than the spread is noise.
"""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record

#: a rank whose step thread waited for a CPU more than this share of its steps is "inflated"
INFLATED_SHARE = 0.10
#: a co-run slowdown above this says ranks slow each other's compute (the probe's noise on an
#: idle machine, 2 ranks pinned to 2 cores: 0.94-1.06)
CORUN_SLOW = 1.25


class ContentionRank(Record):
    """One rank's CPU contention over its profiled steps (contention/rank<R>.json)."""

    rank: Annotated[int, M("the rank")]
    wall_s: Annotated[float | None, M("wall time of the profiled steps, seconds")]
    cpu_wait_s: Annotated[
        float | None,
        M(
            "time the step's thread was runnable but waited for a CPU (schedstat run-queue "
            "delay), seconds; at most wall_s"
        ),
    ]
    cpu_wait_share: Annotated[
        float | None, M("cpu_wait_s / wall_s: the part of the steps spent waiting for a CPU")
    ]
    step_share_max: Annotated[
        float | None, M("the largest cpu_wait_s / wall_s of a single profiled step")
    ]
    threads_runqueue_s: Annotated[
        float | None,
        M("run-queue delay summed over all the rank's threads, seconds (can exceed wall_s)"),
    ]
    cpu_per_wall: Annotated[
        float | None,
        M("process CPU time / wall time over the steps (1 = one core busy all the time)"),
    ]
    involuntary_switches: Annotated[
        int | None, M("times the kernel took a CPU away from the rank's threads")
    ]
    usable_cores: Annotated[int | None, M("CPUs the rank could run on")]
    pinned: Annotated[
        bool | None, M("whether the rank was pinned to its own cores (TRACEKIT_PIN=0: not)")
    ]
    threads: Annotated[int | None, M("torch intra-op threads of the rank")]
    cpu_wait_outside_s: Annotated[
        float | None,
        M(
            "of cpu_wait_s, the part behind other processes, at least: cpu_wait_s less the CPU "
            "time of the rank's other threads (gloo, autograd, profiler), which the step thread "
            "may have waited behind, seconds; null in runs from before it was recorded"
        ),
    ] = None
    cpu_wait_outside_share: Annotated[
        float | None,
        M("cpu_wait_outside_s / wall_s: what inflates the steps from outside the rank"),
    ] = None
    other_threads_cpu_s: Annotated[
        float | None,
        M("CPU time of the rank's threads other than the step's over the steps, seconds"),
    ] = None
    corun_slowdown: Annotated[
        float | None,
        M(
            "the co-run probe, before the first step (tracekit.capture.corun): the rank's time "
            "per matmul while every rank ran it, over its time while the others waited (1: ranks "
            "do not slow each other's compute; 2: computing at once, each ran at half speed); "
            "null for one rank, GPU runs and runs from before it"
        ),
    ] = None


class Contention(Record):
    """CPU contention of a run's ranks; null for traces tracekit did not record."""

    ranks: Annotated[int, M("ranks with a contention file")]
    machine_cores: Annotated[
        int | None, M("CPUs the machine offered the job (the largest any rank saw)")
    ]
    local_ranks: Annotated[int | None, M("ranks per machine (the largest any rank saw)")]
    cpu_wait_share_max: Annotated[
        float | None, M("the largest `per_rank[].cpu_wait_share`; null when none is known")
    ]
    inflated: Annotated[
        list[int],
        M(
            f"ranks whose cpu_wait_outside_share (cpu_wait_share where that is null) exceeds "
            f"{INFLATED_SHARE:.0%}: their times include waiting for other processes"
        ),
    ]
    unavailable: Annotated[
        str | None, M("why the platform could not give a figure; null when all were read")
    ]
    per_rank: Annotated[list[ContentionRank], M("one row per rank with a contention file")]
    own_threads: Annotated[
        list[int],
        M(
            f"ranks not inflated whose cpu_wait_share exceeds {INFLATED_SHARE:.0%}: the step "
            "thread took turns with the rank's own threads on its cores, so communication that "
            "overlaps compute with a core to spare ran in turn with it"
        ),
    ] = []
    cpu_wait_outside_share_max: Annotated[
        float | None,
        M(
            "the largest `per_rank[].cpu_wait_outside_share`: the most a rank's steps waited "
            "behind other processes, the share that decides `inflated`; null in runs from before "
            "it was recorded"
        ),
    ] = None
    corun_slowdown_max: Annotated[
        float | None,
        M(
            f"the largest `per_rank[].corun_slowdown`; above {CORUN_SLOW:g} a warning says that "
            "compute beside other ranks' compute is inflated by up to that factor; null when "
            "none is known"
        ),
    ] = None


class Steps(Record):
    """The job's step time over its complete steps: a step lasts from the earliest rank's
    ProfilerStep start to the latest rank's end."""

    steps: Annotated[int, M("complete steps every rank has")]
    median_s: Annotated[float, M("median step time, seconds")]
    min_s: Annotated[float, M("shortest step, seconds")]
    max_s: Annotated[float, M("longest step, seconds")]
    spread: Annotated[
        float,
        M(
            "(max_s - min_s) / median_s: a difference between two runs' step times smaller "
            "than this share of either is within noise"
        ),
    ]
