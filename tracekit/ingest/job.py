"""What ingest hands the analysis: a Job, everything read from one run folder, typed.

tracekit.ingest.load builds it (the only reader of a run folder on the analysis side); the
timeline and every analysis take what they need from it and read no file. A Job is made of
per-rank pieces (:class:`RankPiece`: what is filed under one rank, read without looking at
another) and what only the whole job has (run.json, the NCCL logs, the rank -> node layout),
so that the per-rank reading can run anywhere and only the assembly needs all of it.

This module holds types only: importing it reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit.ingest.contention_record import ContentionCounts
from tracekit.ingest.run_record import MemoryCounts, RunRecord
from tracekit.ingest.spill import EventsRef, Spill

if TYPE_CHECKING:
    from tracekit.ingest.flight_recorder import FlightRecord
    from tracekit.ingest.kineto_info import TraceInfo
    from tracekit.ingest.nccl_log import NcclLog
    from tracekit.ingest.selection import Selection


@dataclass(frozen=True)
class DumpRead:
    """One flight-recorder dump as read: its record, or only the warning that it could not be."""

    path: Path
    """The dump file."""
    record: FlightRecord | None
    """Its entries and groups; None when the dump is damaged or says no rank."""
    warnings: tuple[str, ...] = ()
    """``flight recorder: ...`` lines: what was wrong with it, or what it lacks."""


@dataclass(frozen=True)
class RankPiece:
    """What the run folder files under one rank, besides its trace (traces are read per file:
    a foreign file tells its rank only once parsed)."""

    rank: int
    """The rank."""
    memory: MemoryCounts | None = None
    """memory/rank<R>.json; None without one (or when it is not a JSON object, or empty)."""
    dumps: tuple[DumpRead, ...] = ()
    """Flight-recorder dumps whose file name names this rank (``fr_rank<R>.json``)."""
    contention: ContentionCounts | None = None
    """contention/rank<R>.json; None without one (foreign traces, older runs)."""
    warnings: tuple[str, ...] = ()
    """Side files that could not be read (each named): the analysis went without them."""


@dataclass(frozen=True)
class NcclLogs:
    """The run's NCCL_DEBUG logs (<run>/nccl/*.log), parsed once."""

    log: NcclLog
    """Everything the logs say (tracekit.ingest.nccl_log.NcclLog)."""
    layout: dict[int, dict[str, Any]]
    """rank -> {host, node, local_rank, source} of the world communicator (nccl_log.rank_layout);
    empty when the logs do not place the ranks."""
    ring: list[int] | None
    """Ring 0's rank order of the largest communicator (nccl_log.ring_order); None when no
    complete ring 0 is in the logs."""
    ring_of: Callable[[int], list[int] | None]
    """Ring 0's rank order of the communicator of N ranks: nccl_log.ring_order bound to these
    logs, so that whoever knows N asks without importing the parser."""


@dataclass(frozen=True)
class Topology:
    """Which node each traced rank ran on (tracekit.ingest.topology.node_of_ranks)."""

    nodes: dict[int, int]
    """rank -> node, for every traced rank."""
    source: str
    """Where it came from: ``ranks_per_node``, ``run.json``, ``nccl_log``, ``host_name`` or
    ``unknown`` (all ranks on one node)."""
    warnings: tuple[str, ...] = ()
    """How to give the topology when it is unknown."""


@dataclass(frozen=True)
class Job:
    """One run folder (or folder of traces, or trace file), read: the analysis reads no file."""

    path: Path
    """What was asked for: a run folder, a folder of Kineto traces, or one trace file."""
    run: RunRecord | None
    """run.json; None outside a run folder."""
    selection: Selection
    """Which trace files were read: all of them, ``--ranks``, or a ``--sample`` (its summary is
    summary.json ``sampling``)."""
    infos: list[TraceInfo]
    """What each trace file says about itself, sorted by rank, one per rank read."""
    events: pl.DataFrame
    """The events of every rank that the cross-rank steps read (tracekit.ingest.rank_scan.SLIM:
    communication, annotations, step markers; tracekit.events.EVENT_SCHEMA), times as the
    traces say. A rank's other events are in ``rank_events``."""
    rank_events: dict[int, EventsRef] = field(default_factory=dict)
    """rank -> where all its events wait (tracekit.ingest.spill: held, or a parquet file),
    read by the per-rank timeline step (tracekit.analyses.rank_map) and on demand."""
    spill: Spill | None = None
    """The scratch folder and memory budget of ``rank_events`` (removed with the Job)."""
    memory: dict[int, MemoryCounts] = field(default_factory=dict)
    """rank -> memory/rank<R>.json, for the ranks read and every rank the folder has a file
    for (so a ``--ranks`` subset still sees its ranks' neighbours counted)."""
    contention: dict[int, ContentionCounts] = field(default_factory=dict)
    """rank -> contention/rank<R>.json: how long it waited for a CPU (our runs only)."""
    flight_records: tuple[FlightRecord, ...] = ()
    """Flight-recorder dumps of every rank in the folder (nccl/, fr_rank*.json), in file order."""
    nccl: NcclLogs | None = None
    """The NCCL_DEBUG logs of nccl/; None without any (or when none could be read)."""
    topology: Topology = field(default_factory=lambda: Topology({}, "unknown"))
    """rank -> node of the ranks read."""
    warnings: tuple[str, ...] = ()
    """What loading found missing, dropped or guessed, one line each, in the order found."""

    @property
    def ranks(self) -> list[int]:
        """The ranks read, in order."""
        return [i.rank for i in self.infos]
