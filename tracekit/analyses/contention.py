"""summary.json ``contention`` and ``steps`` (tracekit.summary.contention): can the run's own
timings be trusted?

``contention`` reads what each rank measured of itself (Job.contention); a rank whose step thread
waited for a CPU behind other processes more than INFLATED_SHARE of its steps gets a warning that
names it, the share and what it inflates. Waiting behind the rank's own threads (a rank pinned
to one core runs its gloo thread in turn with the step: measured 2-22 % on an idle machine, 2
ranks on 2 cores) is a milder, separate line: the rank's own work, serialised. ``steps`` is the
job's step time over the complete steps and its spread. A co-run slowdown above CORUN_SLOW
(tracekit.capture.corun: ranks computing at once each ran that much slower, waiting or not) is
a third line: every compute time that ran beside another rank's is inflated, and a what-if that
removes one rank's work keeps the others' inflated work.
"""

from __future__ import annotations

import statistics

import polars as pl

from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.ingest.contention_record import ContentionCounts
from tracekit.summary.contention import (
    CORUN_SLOW,
    INFLATED_SHARE,
    Contention,
    ContentionRank,
    Steps,
)

#: a step-time spread above this share of the median is said in a warning
NOISY_SPREAD = 0.25


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _rank(rank: int, c: ContentionCounts) -> ContentionRank:
    shares = [w / wall for wall, w in c.step_waits if wall > 0]
    return ContentionRank(
        rank=rank,
        wall_s=c.wall_s,
        cpu_wait_s=c.cpu_wait_s,
        cpu_wait_share=_ratio(c.cpu_wait_s, c.wall_s),
        cpu_wait_outside_s=c.cpu_wait_outside_s,
        cpu_wait_outside_share=_ratio(c.cpu_wait_outside_s, c.wall_s),
        other_threads_cpu_s=c.other_threads_cpu_s,
        step_share_max=max(shares) if shares else None,
        threads_runqueue_s=c.threads_runqueue_s,
        cpu_per_wall=_ratio(c.cpu_s, c.wall_s),
        involuntary_switches=c.involuntary_switches,
        usable_cores=c.usable_cores,
        pinned=c.pinned,
        threads=c.threads,
        corun_slowdown=c.corun_slowdown,
    )


def _most(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def contention(inp: SectionInput) -> SectionResult[Contention]:
    """The ``contention`` section: null without any contention file (foreign traces)."""
    ranks = set(inp.job.ranks)
    counts = {r: c for r, c in sorted(inp.job.contention.items()) if r in ranks}
    if not counts:
        return SectionResult()
    rows = [_rank(r, c) for r, c in counts.items()]
    shares = [r.cpu_wait_share for r in rows if r.cpu_wait_share is not None]
    inflated = [r for r in rows if (_outside(r) or 0) > INFLATED_SHARE]
    own = [r for r in rows if r not in inflated and (r.cpu_wait_share or 0) > INFLATED_SHARE]
    outside = [r.cpu_wait_outside_share for r in rows if r.cpu_wait_outside_share is not None]
    corun = [r.corun_slowdown for r in rows if r.corun_slowdown is not None]
    value = Contention(
        ranks=len(rows),
        machine_cores=_most([c.machine_cores for c in counts.values()]),
        local_ranks=_most([c.local_ranks for c in counts.values()]),
        cpu_wait_share_max=max(shares) if shares else None,
        cpu_wait_outside_share_max=max(outside) if outside else None,
        corun_slowdown_max=max(corun) if corun else None,
        inflated=[r.rank for r in inflated],
        own_threads=[r.rank for r in own],
        unavailable=next((c.unavailable for c in counts.values() if c.unavailable), None),
        per_rank=rows,
    )
    warnings = [_warning(value, inflated)] if inflated else []
    if own:
        warnings.append(_own_note(own))
    if value.corun_slowdown_max is not None and value.corun_slowdown_max > CORUN_SLOW:
        warnings.append(_corun_warning(rows))
    return SectionResult(value, warnings=warnings)


def _corun_warning(rows: list[ContentionRank]) -> str:
    slow = [r for r in rows if (r.corun_slowdown or 0) > CORUN_SLOW]
    who = ", ".join(f"{r.rank} ({r.corun_slowdown:.2g}x)" for r in slow)
    return (
        f"contention (co-run): rank(s) {who} computed that much slower while the other ranks "
        "computed than alone (the probe before the first step; the ranks share CPUs or a core's "
        "units): compute that ran beside other ranks' compute is inflated by up to that factor, "
        "and a what-if that removes one rank's work (predict --without-straggler) keeps the "
        "others' work as slowed; rerun with fewer ranks or more cores"
    )


def _outside(r: ContentionRank) -> float | None:
    """The share that inflates the rank from outside; the whole wait in older files."""
    return r.cpu_wait_outside_share if r.cpu_wait_outside_s is not None else r.cpu_wait_share


def _own_note(own: list[ContentionRank]) -> str:
    who = ", ".join(f"{r.rank} ({r.cpu_wait_share:.0%})" for r in own)
    cores = _most([r.usable_cores for r in own])
    return (
        f"contention (own threads): rank(s) {who} waited for a CPU that share of their steps "
        f"behind their own threads (gloo, autograd, profiler) on {cores or 'their'} core(s), not "
        "behind other processes: communication and compute that overlap where a core is spare "
        "ran in turn here, so overlap is understated and step times overstated by up to that share"
    )


def _warning(value: Contention, inflated: list[ContentionRank]) -> str:
    who = ", ".join(f"{r.rank} ({_outside(r) or 0:.0%})" for r in inflated)
    threads = _most([r.threads for r in value.per_rank])
    machine = (
        f"{value.local_ranks} ranks"
        + (f" x {threads} threads" if threads else "")
        + (f" on {value.machine_cores} cores" if value.machine_cores else "")
        if value.local_ranks
        else "ranks"
    )
    return (
        f"contention: rank(s) {who} waited for a CPU that share of their profiled steps "
        f"({machine}): their compute, bubble and step times include that waiting, so they "
        "overstate what the strategy costs; rerun with fewer ranks or on an idle machine"
    )


#: the frame ``steps``: the job's steps (the timeline draws their boundaries)
STEPS_SCHEMA = {"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}


def step_frame(markers: pl.DataFrame) -> pl.DataFrame:
    """Each step every rank has: its earliest start and latest end over the ranks."""
    if markers.height == 0:
        return pl.DataFrame(schema=STEPS_SCHEMA)
    n = markers["rank"].n_unique()
    return (
        markers.group_by("step")
        .agg(pl.col("rank").n_unique().alias("n"), pl.col("start_ns").min(), pl.col("end_ns").max())
        .filter(pl.col("n") == n)
        .sort("step")
        .select(list(STEPS_SCHEMA))
        .cast(STEPS_SCHEMA)  # type: ignore[arg-type]
    )


def step_times(markers: pl.DataFrame) -> list[float]:
    """Seconds of each step every rank has (:func:`step_frame`)."""
    per = step_frame(markers)
    return [(e - s) * 1e-9 for s, e in zip(per["start_ns"], per["end_ns"], strict=True)]


def steps(inp: SectionInput) -> SectionResult[Steps]:
    """The ``steps`` section: null with fewer than two complete steps."""
    analysed = inp.markers.filter(pl.col("rank").is_in(inp.job.ranks))
    frame = step_frame(analysed)
    times = step_times(analysed)
    if len(times) < 2:
        return SectionResult(frames={"steps": frame})
    median = statistics.median(times)
    value = Steps(
        steps=len(times),
        median_s=median,
        min_s=min(times),
        max_s=max(times),
        spread=(max(times) - min(times)) / median if median > 0 else 0.0,
    )
    warnings = []
    if value.spread > NOISY_SPREAD:
        warnings.append(
            f"steps: step time varied from {value.min_s:.3g} to {value.max_s:.3g} s over "
            f"{value.steps} steps ({value.spread:.0%} of the median {median:.3g} s): a "
            "difference from another run smaller than that is noise"
        )
    return SectionResult(value, {"steps": frame}, warnings)
