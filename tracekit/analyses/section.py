"""The analysis contract: the per-rank map's task and result, and a section's input and result.

    RankTask -> map_ranks -> RankResult     per batch of ranks (tracekit.analyses.rank_map), on
                                            the engine; ``combine`` puts the batches together
    SectionInput -> section -> SectionResult  once per section of summary.json, on the driver

A section is a pure function: it reads the Job (tracekit.ingest.job: what was loaded) and the
frames of the timeline step (tracekit.analyses.prepare), never a file, and returns its summary
value, the frames written beside summary.json, and its warnings. tracekit.analyses.manifest
lists them. Sections are the cross-rank reduce: what needs a rank's every event was computed
per rank by the map (tracekit.analyses.rank_map) and reaches them as ``per_rank``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import polars as pl

from tracekit.analyses.event_totals import reduce_totals
from tracekit.ingest.job import Job
from tracekit.ingest.spill import EventsRef
from tracekit.summary.traffic import Clock

if TYPE_CHECKING:
    from tracekit.ingest.kineto_info import TraceInfo
    from tracekit.ingest.run_record import RunRecord

V = TypeVar("V")


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
    top_ops: pl.DataFrame
    """Each rank's top-level compute events: rank, name, start_ns, end_ns
    (tracekit.analyses.root_causes.top_level_ops), for the why section's excess by op."""
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
        top_ops=cat([r.top_ops for r in results]),
        empty=sorted(rank for r in results for rank in r.empty),
    )


@dataclass(frozen=True)
class SectionInput:
    """What every section gets: the Job and the frames of the timeline step, read-only."""

    job: Job
    """Everything loaded (run.json, memory counts, flight records, NCCL logs, topology)."""
    infos: list[TraceInfo]
    """The ranks analysed: the Job's, less those without compute or communication events."""
    events: pl.DataFrame
    """Their slim events (communication, annotations, step markers: tracekit.ingest.rank_scan),
    clocks aligned (tracekit.clock). A rank's other events were read by the map only."""
    windows: pl.DataFrame
    """One row per rank: rank, kind, steps, start_ns, end_ns, cutoff_ns (tracekit.timeline)."""
    markers: pl.DataFrame
    """ProfilerStep markers: rank, step, start_ns, end_ns."""
    collectives: pl.DataFrame
    """One row per collective call per rank in the window, matched across ranks
    (tracekit.analyses.collectives)."""
    nodes: dict[int, int]
    """rank -> node of the ranks analysed."""
    per_rank: RankResult
    """What the per-rank map computed from each rank's every event, over every rank
    (:func:`combine`)."""
    clock: Clock | None = None
    """summary.json ``clock``: offsets between hosts, and whether they were applied."""
    shifts: dict[int, int] = field(default_factory=dict)
    """rank -> the clock offset applied to its times, in ns (tracekit.clock); empty when the
    clocks were not moved."""
    warnings: tuple[str, ...] = ()
    """Everything loading and the timeline step warned of, in order."""

    @property
    def run(self) -> RunRecord | None:
        """run.json, typed; None outside a run folder."""
        return self.job.run

    @property
    def steps(self) -> int:
        """Complete steps in the window: the fewest over the ranks (0 without step markers)."""
        return (
            int(cast("int | None", self.windows["steps"].min()) or 0) if self.windows.height else 0
        )


@dataclass(frozen=True)
class SectionResult(Generic[V]):
    """What a section gives: its summary.json value (its Struct of tracekit.summary), its frames
    and its warnings."""

    value: V | None = None
    """The section's value, the Summary field of its key; None when the input has nothing for
    it (summary.json null)."""
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    """Tables written as analysis/<name>.parquet (and on Analysis.frames), each declared in
    tracekit.analyses.frames."""
    warnings: list[str] = field(default_factory=list)
    """One line each, prefixed with the section's name."""


#: a section's computation: its input -> its result (tracekit.analyses.manifest)
Compute = Callable[[SectionInput], SectionResult[Any]]
