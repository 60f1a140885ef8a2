"""What a section of summary.json gets and gives: :class:`SectionInput` -> :class:`SectionResult`.

A section is a pure function: it reads the Job (tracekit.ingest.job: what was loaded) and the
frames of the timeline step (tracekit.analyses.prepare), never a file, and returns its summary
value, the frames written beside summary.json, and its warnings. tracekit.analyses.registry
lists them. Sections are the cross-rank reduce: what needs a rank's every event was computed
per rank by the map (tracekit.analyses.rank_map) and reaches them as ``per_rank``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from tracekit.ingest.job import Job

if TYPE_CHECKING:
    from tracekit.analyses.rank_map import RankResult
    from tracekit.ingest.kineto_info import TraceInfo
    from tracekit.ingest.run_record import RunRecord

#: a section's summary.json value: an object, a list of rows (``ranks``), or None (nothing for it)
SummaryValue = dict[str, Any] | list[dict[str, Any]] | None


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
    (tracekit.analyses.rank_map.combine)."""
    clock: dict[str, Any] | None = None
    """summary.json ``clock``: offsets between hosts, and whether they were applied."""
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
class SectionResult:
    """What a section gives: its summary.json value, its frames and its warnings."""

    value: SummaryValue = None
    """The section's summary.json value; None when the input has nothing for it."""
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    """Tables written as analysis/<name>.parquet (and on Analysis.frames)."""
    warnings: list[str] = field(default_factory=list)
    """One line each, prefixed with the section's name."""


#: a section: its input -> its result (tracekit.analyses.registry.SECTIONS)
Section = Callable[[SectionInput], SectionResult]
