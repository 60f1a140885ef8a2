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

from tracekit import timeline
from tracekit.analyses import collectives, overlap, pipeline_ops
from tracekit.analyses.breakdown import rank_breakdown
from tracekit.analyses.event_totals import event_totals
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
    """What a batch gives back (module docstring)."""

    windows: pl.DataFrame
    breakdown: pl.DataFrame
    overlap_units: pl.DataFrame
    pipeline_ops: pl.DataFrame
    pipeline_pieces: dict[int, list[tuple[int, int]]]
    blocking: frozenset[tuple[int, int]]
    event_totals: pl.DataFrame
    timeline: dict[int, EventsRef]
    empty: list[int] = field(default_factory=list)


def _events(task: RankTask) -> pl.DataFrame:
    frames = [ref.read() for ref in task.events]
    events = pl.concat(frames, how="vertical", rechunk=False) if len(frames) > 1 else frames[0]
    offsets = {r: off for r, off in task.shifts.items() if off}
    if offsets:  # tracekit.clock.align's shift, for these ranks
        shift = (
            pl.col("rank").cast(pl.Int64).replace_strict(offsets, default=0, return_dtype=pl.Int64)
        )
        events = events.with_columns(pl.col("start_ns") - shift, pl.col("end_ns") - shift)
    return events


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
    ops, pieces, _ = pipeline_ops.pipeline_ops(events, task.markers)
    blocking = pipeline_ops.blocking_comm(events)[1] if ops.height else set()
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
    import uuid

    parts = frame.partition_by("rank", as_dict=True, maintain_order=True)
    out = {}
    for (rank,), part in parts.items():
        out[int(rank)] = (
            EventsRef(frame=part)
            if task.folder is None
            else write(part, f"{task.folder}/timeline-{uuid.uuid4().hex}.parquet")
        )
    return out
