"""The timeline step: from a Job to what every section reads (a SectionInput), as a per-rank map
and a cross-rank reduce; the driver never holds every rank's events (issue #17).

In order, on the Job's slim events (tracekit.ingest.rank_scan: calls, kernels, annotations):
process groups (tracekit.analyses.groups: the Job's flight records, run.json's groups, each
trace's pg_config), every collective call matched across ranks
(tracekit.analyses.collectives), once, clock offsets between hosts (tracekit.clock: when
applied, the matched calls move with the events). Then the map (tracekit.analyses.rank_map), one
task per batch of ranks, through the engine's Executor: the analysis window, the
compute/communication intervals and the elementary segments of each rank, and what the
sections need of them (breakdown rows, overlap units, pipeline ops, the merged timeline).
Ranks held in memory go in one batch (a small job is one whole-job step, as fast as before);
ranks whose events wait in files go one per task. Ranks without any compute or communication
event in their window are left out, with a warning (their calls, if any lie outside it, are
then matched again without them: the one case of a second matching).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec
import polars as pl

from tracekit import clock, timeline
from tracekit.analyses import collectives, groups
from tracekit.analyses.rank_map import map_ranks
from tracekit.analyses.section import RankResult, RankTask, SectionInput, combine
from tracekit.errors import TracekitError
from tracekit.ingest.job import Job
from tracekit.summary.traffic import Clock

#: the times of a matched call: moved with its rank's clock
CALL_TIMES = ("start_ns", "end_ns", "call_start_ns", "call_end_ns")

#: runs map_ranks over the tasks, results in order (an Executor's ``map``)
MapFn = Callable[[Callable[[RankTask], RankResult], Iterable[RankTask]], Iterable[RankResult]]


def prepare(
    job: Job, align_clocks: bool | None = None, map_fn: MapFn | None = None
) -> SectionInput:
    """The timeline step (see the module docstring). ``align_clocks``: None aligns rank clocks
    when the traces come from several hosts, True always, False never. ``map_fn``: where the
    per-rank tasks run (an Executor's ``map``; default here, one after the other)."""
    infos, events = job.infos, job.events
    nodes = dict(job.topology.nodes)
    warnings = list(job.warnings)
    gpu_ranks = {i.rank for i in infos if i.has_gpu}
    group_sizes = {i.rank: int(i.world_size) for i in infos if i.world_size}
    sources = groups.GroupSources.of(job)
    calls, call_warnings = collectives.raw_collectives(events, group_sizes, sources)
    events, sources, clock_summary, clock_warn = clock.align(
        events, infos, sources, calls, align_clocks
    )
    shifts = clock.applied_offsets(clock_summary)
    # times moved by a constant per rank: the calls move with them, matched as they were (the
    # k-th call of a group, transfer = the shortest member's duration: neither depends on it)
    calls = clock.shifted(calls, shifts, CALL_TIMES)
    warnings.extend(clock_warn)
    warnings.extend(timeline.marker_warnings(events))
    markers = timeline.step_markers(events)

    tasks = _tasks(job, shifts, gpu_ranks, calls, markers, nodes)
    per_rank = combine(list((map_fn or map)(map_ranks, tasks)))
    windows, empty = per_rank.windows, per_rank.empty
    if not windows.height:
        raise TracekitError(
            "the traces hold no compute or communication events: nothing to analyse", job.path
        )
    if empty:  # a rank with only metadata/annotations: say so and leave it out
        warnings.append(
            f"ranks {empty}: no compute or communication events in the window; left out"
        )
        keep = ~pl.col("rank").is_in(empty)
        events, markers = events.filter(keep), markers.filter(keep)
        if calls.filter(~keep).height:  # its calls outside its window: match again without them
            calls, call_warnings = collectives.raw_collectives(events, group_sizes, sources)
        infos = [i for i in infos if i.rank not in empty]
        nodes = {r: n for r, n in nodes.items() if r not in empty}
    coll, coll_warn = collectives.collectives_table((calls, call_warnings), windows)
    warnings = groups.drop_resolved_warnings(warnings, coll) + coll_warn
    return SectionInput(
        job=job,
        infos=infos,
        events=events,
        windows=windows,
        markers=markers,
        collectives=coll,
        nodes=nodes,
        per_rank=per_rank,
        clock=None if clock_summary is None else msgspec.convert(clock_summary, Clock, strict=True),
        shifts=shifts,
        warnings=tuple(warnings),
    )


def _tasks(
    job: Job,
    shifts: dict[int, int],
    gpu_ranks: set[int],
    calls: pl.DataFrame,
    markers: pl.DataFrame,
    nodes: dict[int, int],
) -> list[RankTask]:
    """Held ranks in one batch, ranks waiting in files one per task (module docstring)."""
    held = [r for r in job.ranks if job.rank_events[r].frame is not None]
    filed = [r for r in job.ranks if job.rank_events[r].frame is None]
    folder = str(job.spill.folder) if filed and job.spill is not None else None
    batches = ([held] if held else []) + [[r] for r in filed]
    p2p = calls.filter(
        pl.col("op").is_in(["send", "recv"])
        & pl.col("call_id").is_not_null()
        & (pl.col("device") == "cpu")
    )
    return [
        RankTask(
            ranks=batch,
            events=[job.rank_events[r] for r in batch],
            shifts={r: shifts.get(r, 0) for r in batch},
            gpu_ranks=frozenset(r for r in batch if r in gpu_ranks),
            calls=_calls_of(calls, p2p, batch),
            markers=markers.filter(pl.col("rank").is_in(batch)),
            nodes={r: nodes[r] for r in batch if r in nodes},
            folder=None if batch is held else folder,
        )
        for batch in batches
    ]


def _calls_of(calls: pl.DataFrame, p2p: pl.DataFrame, batch: Sequence[int]) -> pl.DataFrame:
    """The batch's rows of the collectives table, and the p2p rows of its peers' halves."""
    mine = pl.col("rank").is_in(batch)
    ids = p2p.filter(mine)["call_id"].unique()
    peers = p2p.filter(~mine & pl.col("call_id").is_in(ids.implode()))
    return pl.concat([calls.filter(mine), peers.select(calls.columns)], how="vertical")
