"""The per-rank timeline step (the map's second step): a batch of ranks' events -> small results.

Everything below looks at one rank at a time (every query is keyed by rank), so a batch of
ranks gives exactly the rows the whole job would, and the batches can run anywhere
(tracekit.engines). What a batch needs from the other ranks comes with it (:class:`RankTask`):
its clock shift (tracekit.clock: times move by a constant per rank), its rows of the matched
collectives table (gloo p2p transfers need the peer's times; overlap needs the calls) and its
step markers. What it gives (:class:`RankResult`) is small and independent of the trace's
length, but for the merged timeline, which waits where the events wait (tracekit.ingest.spill):

- ``windows``: each rank's analysis window (tracekit.timeline.analysis_windows, refined on GPU);
- ``breakdown``: summary.json ``ranks[]`` rows (tracekit.analyses.breakdown.rank_breakdown);
- ``overlap_units``: one row per all-gather / reduce-scatter (tracekit.analyses.overlap);
- ``pipeline_ops`` and the busy pieces of each rank (tracekit.analyses.pipeline_ops), and the
  blocking receives (for the recv split when the traces carry no labels);
- ``event_totals``: count and total time per event name (tracekit.analyses.event_totals);
- ``timeline``: the merged state segments (rank, start_ns, end_ns, state).

Ranks without any compute or communication event in their window come back in ``empty``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit import clock, timeline
from tracekit.analyses import collectives, overlap, pipeline_ops
from tracekit.analyses.breakdown import rank_breakdown
from tracekit.analyses.event_totals import event_totals, reduce_totals
from tracekit.ingest.spill import EventsRef, write


@dataclass(frozen=True)
class RankTask:
    """One batch of ranks and what it needs from the rest of the job."""

    ranks: list[int]
    """The ranks, in order."""
    events: list[EventsRef]
    """Where each rank's events wait (same order)."""
    shifts: dict[int, int]
    """rank -> clock offset in ns to subtract (tracekit.clock), 0 when not aligned."""
    gpu_ranks: frozenset[int]
    """Those of the batch whose trace has GPU work."""
    calls: pl.DataFrame
    """The matched collectives table (tracekit.analyses.collectives.raw_collectives, times
    aligned): the batch's rows, and the p2p rows of the calls it shares with other ranks."""
    markers: pl.DataFrame
    """The batch's ProfilerStep markers (times aligned)."""
    nodes: dict[int, int]
    """rank -> node."""
    folder: str | None = None
    """Where a merged timeline goes when the events wait in files (None: held, like them)."""


@dataclass(frozen=True)
class RankResult:
    """What a batch gives back (module docstring); :func:`combine` puts every batch's together."""

    windows: pl.DataFrame
    """Each rank's analysis window (tracekit.timeline.analysis_windows), the empty ones left out."""
    breakdown: pl.DataFrame
    """summary.json ``ranks[]`` rows (tracekit.analyses.breakdown.rank_breakdown)."""
    overlap_units: pl.DataFrame
    """One row per all-gather / reduce-scatter call per rank (tracekit.analyses.overlap)."""
    pipeline_ops: pl.DataFrame
    """Pipeline ops per rank (tracekit.analyses.pipeline_ops)."""
    pipeline_pieces: dict[int, list[tuple[int, int]]]
    """rank -> the busy pieces of its pipeline ops, sorted."""
    blocking: frozenset[tuple[int, int]]
    """(rank, start_ns) of receives that block (no compute inside their span)."""
    event_totals: pl.DataFrame
    """count and total_ns per event name, kind and device (tracekit.analyses.event_totals)."""
    timeline: dict[int, EventsRef]
    """rank -> where its merged timeline waits (rank, start_ns, end_ns, state)."""
    empty: list[int] = field(default_factory=list)
    """Ranks without any compute or communication event in their window."""


def combine(results: list[RankResult]) -> RankResult:
    """The batches' results put together in rank order (a batch's ranks are in order; which
    ranks share a batch depends on the memory budget, so the rows are sorted by rank)."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    timelines: dict[int, EventsRef] = {}
    for r in results:
        pieces.update(r.pipeline_pieces)
        timelines.update(r.timeline)

    def cat(frames: list[pl.DataFrame]) -> pl.DataFrame:
        return pl.concat(frames, how="vertical").sort("rank", maintain_order=True).rechunk()

    return RankResult(
        windows=cat([r.windows for r in results]),
        breakdown=cat([r.breakdown for r in results]),
        overlap_units=cat([r.overlap_units for r in results]),
        pipeline_ops=cat([r.pipeline_ops for r in results]),
        pipeline_pieces=pieces,
        blocking=frozenset().union(*(r.blocking for r in results)),
        event_totals=reduce_totals([r.event_totals for r in results]),
        timeline=dict(sorted(timelines.items())),
        empty=sorted(rank for r in results for rank in r.empty),
    )


def _events(task: RankTask) -> pl.DataFrame:
    frames = [ref.read() for ref in task.events]
    events = pl.concat(frames, how="vertical", rechunk=False) if len(frames) > 1 else frames[0]
    return clock.shifted(events, task.shifts)


def map_ranks(task: RankTask) -> RankResult:
    """The per-rank timeline step of one batch (module docstring)."""
    events = _events(task)
    gpu = set(task.gpu_ranks)
    windows = timeline.analysis_windows(events, gpu)
    iv = timeline.intervals(events, windows, gpu, task.calls)
    windows = timeline.refine_gpu_windows(windows, iv, gpu)
    empty = windows.filter(pl.col("start_ns").is_null() | pl.col("end_ns").is_null())[
        "rank"
    ].to_list()
    kept = windows.filter(~pl.col("rank").is_in(empty))
    if empty:
        keep = ~pl.col("rank").is_in(empty)
        iv, events = iv.filter(keep), events.filter(keep)
    seg = timeline.segments(iv, kept)
    merged = timeline.merge_states(seg)
    mine = task.calls.filter(pl.col("rank").is_in(task.ranks))
    coll, _ = collectives.collectives_table((mine, []), kept)
    units = overlap.overlap_units(events, coll, seg, gpu)
    ops, pieces, blocking = pipeline_ops.pipeline_ops(events, task.markers)
    return RankResult(
        windows=kept,
        breakdown=rank_breakdown(seg, kept, task.markers, task.nodes),
        overlap_units=units,
        pipeline_ops=ops,
        pipeline_pieces=pieces,
        blocking=frozenset(blocking),
        event_totals=event_totals(events),
        timeline=_keep(merged, task),
        empty=empty,
    )


def _keep(frame: pl.DataFrame, task: RankTask) -> dict[int, EventsRef]:
    """Each rank's merged timeline, held (its events are) or written into the spill folder."""
    parts = frame.partition_by("rank", as_dict=True, maintain_order=True)
    return {
        int(rank): EventsRef(frame=part)
        if task.folder is None
        else write(part, task.folder, "timeline")
        for (rank,), part in parts.items()
    }
