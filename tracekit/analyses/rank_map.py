"""The per-rank timeline step (the map's second step): a batch of ranks' events -> small results.

Everything below looks at one rank at a time (every query is keyed by rank), so a batch of
ranks gives exactly the rows the whole job would, and the batches can run anywhere
(tracekit.engines). What a batch needs from the other ranks comes with it (:class:`RankTask`):
its clock shift (tracekit.clock: times move by a constant per rank), its rows of the matched
collectives table (gloo p2p transfers need the peer's times; overlap needs the calls) and its
step markers. What it gives (:class:`RankResult`) is small and independent of the trace's
length, but for the merged timeline, which waits where the events wait (tracekit.ingest.spill).
Both types are the section contract's (tracekit.analyses.section):

- ``windows``: each rank's analysis window (tracekit.timeline.analysis_windows, refined on GPU);
- ``breakdown``: summary.json ``ranks[]`` rows (tracekit.analyses.breakdown.rank_breakdown);
- ``overlap_units``: one row per all-gather / reduce-scatter (tracekit.analyses.overlap);
- ``pipeline_ops`` and the busy pieces of each rank (tracekit.analyses.pipeline_ops), and the
  blocking receives (for the recv split when the traces carry no labels);
- ``event_totals``: count and total time per event name (tracekit.analyses.event_totals);
- ``timeline``: the merged state segments (rank, start_ns, end_ns, state);
- ``top_ops``: each rank's top-level compute events (tracekit.analyses.root_causes), which
  the why section charges excess to by name.

Ranks without any compute or communication event in their window come back in ``empty``.
"""

from __future__ import annotations

import polars as pl

from tracekit import clock, gloo_threads, timeline
from tracekit.analyses import collectives, overlap, pipeline_ops
from tracekit.analyses.breakdown import rank_breakdown
from tracekit.analyses.event_totals import event_totals
from tracekit.analyses.root_causes import top_level_ops
from tracekit.analyses.section import RankResult, RankTask
from tracekit.ingest.spill import EventsRef, write

#: the events' columns the map reads (tracekit.events.EVENT_SCHEMA less the collective
#: arguments, which the collectives table carries, and the stream and external ids), and the
#: runloop flag in place of the thread names (tracekit.gloo_threads): a rank read back from
#: its parquet file holds no other (at 405 MB of JSON: 192 -> 111 MB)
MAP_COLUMNS = (
    "rank",
    "device",
    "pid",
    "tid",
    "cat",
    "name",
    "start_ns",
    "end_ns",
    "kind",
    "op",
    "correlation",
)


def _events(task: RankTask) -> pl.DataFrame:
    flag = gloo_threads.named_runloop().alias(gloo_threads.NAMED_RUNLOOP)
    columns: list[str | pl.Expr] = [*MAP_COLUMNS, flag]
    frames = [ref.read(columns) for ref in task.events]
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
        top_ops=top_level_ops(events, gpu),
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
