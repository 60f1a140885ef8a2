"""Load once: a run folder (or a folder of Kineto traces, or one trace file) -> a Job.

The only reader of a run folder on the analysis side: run.json, the traces, memory/rank<R>.json,
the flight-recorder dumps and the NCCL logs are read here, once, and handed on as a
tracekit.ingest.job.Job; the timeline and the analyses read no file. In steps:

    locate(path)           Source: run.json read, the other files listed       (the job)
    select(...)            the trace files to read: --ranks, --sample          (the job)
    scan_traces(files)     RankScan per file: info, slim events, where the     (per file)
                           rest waits (tracekit.ingest.rank_scan, .spill)
    load_rank(source, r)   RankPiece: memory/, contention/rank<R>.json, fr_rank<R>.json (per rank)
    assemble(...)          Job: NCCL logs, topology, warnings                  (the job)

The Job holds every rank's *slim* events (what the cross-rank steps read) and, per rank, where
its other events wait (``Job.rank_events``): never the events of all ranks at once, beyond the
memory budget of tracekit.ingest.spill.

Traces are read per file because a file brought from elsewhere tells its rank only once parsed;
everything else filed under a rank is read by :func:`load_rank`, which needs nothing but the
Source and the rank, so the per-file and per-rank parts can run wherever the files are.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from tracekit import guarded_read, runfolder
from tracekit.errors import TracekitError
from tracekit.events import empty_events
from tracekit.ingest import foreign
from tracekit.ingest.contention_record import ContentionCounts
from tracekit.ingest.flight_recorder import read_flight_record
from tracekit.ingest.job import DumpRead, Job, NcclLogs, RankPiece
from tracekit.ingest.rank_scan import RankScan, ReadProgress, scan_traces
from tracekit.ingest.read_options import ReadOptions
from tracekit.ingest.run_record import MemoryCounts, RunRecord
from tracekit.ingest.selection import Selection, select
from tracekit.ingest.spill import Spill
from tracekit.ingest.topology import node_of_ranks


@dataclass(frozen=True)
class Source:
    """What PATH holds, listed but not read (apart from run.json): the job-level first step."""

    path: Path
    """What was asked for."""
    folder: bool
    """PATH is a folder: memory counts and NCCL logs are read only from one."""
    run: RunRecord | None
    """run.json; None outside a run folder."""
    traces: tuple[Path, ...]
    """Every trace file PATH names (tracekit.runfolder.find_trace_files)."""
    dumps: tuple[Path, ...]
    """Flight-recorder dumps: nccl/*.json, fr_rank*.json (tracekit.runfolder.flight_recorder_dumps)."""
    dumps_of: dict[int, tuple[Path, ...]]
    """rank -> the dumps whose file name names it (``fr_rank<R>.json``)."""
    memory_ranks: frozenset[int]
    """Ranks with a memory/rank<R>.json."""
    skipped: tuple[str, ...] = ()
    """Warnings: entries named like a trace or an NCCL log that are not regular files."""

    def named_ranks(self) -> set[int]:
        """Ranks that have a file of their own besides the trace: a memory count or a dump."""
        return set(self.memory_ranks) | set(self.dumps_of)


def locate(path: str | Path) -> Source:
    """Read run.json and list the rest; TracekitError when PATH holds no trace to read."""
    path = Path(path)
    folder = runfolder.is_folder(path)
    data = runfolder.load_run_json(path) if folder else None
    run = RunRecord.from_json(data) if data is not None else None
    skipped: list[str] = []
    found = runfolder.find_trace_files(path, skipped)
    if folder:
        skipped += runfolder.skipped_nccl_entries(path)
    if not found and run is not None:
        raise TracekitError(
            f"no traces in {runfolder.traces_dir(path).name}/: no rank wrote one "
            f"({run.status_line()})",
            path,
        )
    if not found:
        raise TracekitError("no Kineto trace files (*.json, *.json.gz) found", path)
    dumps = tuple(runfolder.flight_recorder_dumps(path))
    dumps_of: dict[int, list[Path]] = {}
    for dump in dumps:
        rank = runfolder.rank_from_filename(dump.name)
        if rank is not None:
            dumps_of.setdefault(rank, []).append(dump)
    return Source(
        path=path,
        folder=folder,
        run=run,
        traces=tuple(found),
        dumps=dumps,
        dumps_of={r: tuple(d) for r, d in dumps_of.items()},
        memory_ranks=frozenset(runfolder.memory_ranks(path) if folder else ()),
        skipped=tuple(skipped),
    )


def read_dump(path: Path) -> DumpRead:
    """One flight-recorder dump; a damaged one is a warning, never an error."""
    try:
        rec = read_flight_record(path)
    except TracekitError as exc:
        return DumpRead(path, None, (f"flight recorder: {exc}",))
    warnings = tuple(f"flight recorder: {w}" for w in rec.warnings)
    return DumpRead(path, rec if rec.rank is not None else None, warnings)


def load_rank(source: Source, rank: int) -> RankPiece:
    """What SOURCE files under RANK besides its trace: memory/rank<R>.json (kept when it is a
    non-empty JSON object), the flight-recorder dumps named for the rank, and
    contention/rank<R>.json (run folders only)."""
    memory = contention = None
    warnings: list[str] = []
    if source.folder and rank in source.memory_ranks:
        where = runfolder.memory_path(source.path, rank)
        data, problem = runfolder.load_side_json(where)
        memory = MemoryCounts.from_json(data) if isinstance(data, dict) and data else None
        warnings += [problem] if problem else []
        if isinstance(data, dict):
            warnings += [f"{where}: {p}" for p in MemoryCounts.problems(data)]
    if source.folder and source.run is not None:  # only our runs meter themselves
        data, problem = runfolder.load_side_json(runfolder.contention_path(source.path, rank))
        contention = ContentionCounts.from_json(data) if isinstance(data, dict) else None
        warnings += [problem] if problem else []
    dumps = tuple(read_dump(p) for p in source.dumps_of.get(rank, ()))
    return RankPiece(rank, memory, dumps, contention, tuple(warnings))


def read_nccl(path: Path, warnings: list[str] | None = None) -> NcclLogs | None:
    """The NCCL_DEBUG logs of folder PATH's nccl/, parsed; None without any, or when none can be
    read (the analysis then goes without them; why is added to WARNINGS)."""
    from tracekit.ingest.nccl_log import rank_layout, read_nccl_logs, ring_order

    folder = runfolder.nccl_log_dir(path)
    if folder is None:
        return None
    try:
        log = read_nccl_logs(folder)
    except guarded_read.Unread as exc:  # a log that cannot be read: said, not silent
        if warnings is not None:
            warnings.append(f"NCCL logs not used: {exc}")
        return None
    except TracekitError:  # no NCCL lines in them: nothing to say
        return None
    return NcclLogs(log, rank_layout(log), ring_order(log), functools.partial(ring_order, log))


def assemble(
    source: Source,
    selection: Selection,
    scans: Sequence[RankScan],
    pieces: Iterable[RankPiece],
    *,
    ranks_per_node: int | None = None,
    subset: bool = False,
    spill: Spill | None = None,
) -> Job:
    """The Job from its parts: the traces read, the per-rank pieces and what only the whole job
    has (NCCL logs, topology). ``subset``: only some ranks were asked for (no warning then about
    the ranks without a trace). Warnings in the order found: selection, each trace's, missing
    ranks, the run's status, what the traces lack, topology, flight-recorder dumps."""
    run = source.run
    infos = [s.info for s in scans]
    events = (
        pl.concat([s.slim for s in scans], how="vertical", rechunk=False)
        if scans
        else empty_events()
    )
    warnings: list[str] = list(source.skipped) + list(selection.warnings)
    for info in infos:
        warnings.extend(f"{info.path.name}: {w}" for w in info.warnings)
    missing = None if subset else foreign.missing_ranks_warning(infos, run)
    warnings.extend([missing] if missing else [])
    if run is not None and run.status not in (None, "ok"):
        warnings.append(run.status_line())
    flags = pl.concat([s.flags for s in scans]) if scans else None
    if flags is not None:
        warnings.extend(foreign.coverage_warnings(infos, flags, run))
    if all(s.facts["start"] is None for s in scans):
        raise TracekitError("the traces hold no timed events", source.path)

    nccl = read_nccl(source.path, warnings)
    topology = node_of_ranks(
        [i.rank for i in infos],
        run.nodes if run is not None else None,
        ranks_per_node,
        {i.rank: i.host_name for i in infos},
        layout=nccl.layout if nccl is not None else None,
    )
    warnings.extend(topology.warnings)
    pieces = list(pieces)
    # dumps in file order; those no piece brought (no rank in the name) are read here
    brought = {d.path: d for piece in pieces for d in piece.dumps}
    order = [brought.get(p) or read_dump(p) for p in source.dumps]
    for dump in order:
        warnings.extend(dump.warnings)
    for piece in pieces:
        warnings.extend(piece.warnings)
    return Job(
        path=source.path,
        run=run,
        selection=selection,
        infos=infos,
        events=events,
        rank_events={s.info.rank: s.events for s in scans},
        spill=spill,
        memory={p.rank: p.memory for p in pieces if p.memory is not None},
        contention={p.rank: p.contention for p in pieces if p.contention is not None},
        flight_records=tuple(d.record for d in order if d.record is not None),
        nccl=nccl,
        topology=topology,
        warnings=tuple(warnings),
    )


def read_selected(
    source: Source,
    selection: Selection,
    options: ReadOptions,
    spill: Spill,
    *,
    cache_writer: Executor | None = None,
    executor: Executor | None = None,
    progress: ReadProgress | None = None,
) -> list[RankScan]:
    """The selected trace files, read (tracekit.ingest.rank_scan.scan_traces: one task per
    file), with the ranks not asked for dropped (files that tell their rank only inside)."""
    files, ranks = selection.files, options.ranks
    scans = (
        scan_traces(
            files, spill, options, cache_writer=cache_writer, executor=executor, progress=progress
        )
        if files
        else []
    )
    if ranks or selection.sampled is not None:
        keep = (
            set(selection.sampled)
            if selection.sampled is not None
            else {s.info.rank for s in scans if ranks is not None and s.info.rank in ranks}
        )
        scans = [s for s in scans if s.info.rank in keep]
        if not scans:
            raise TracekitError(
                "none of the ranks asked for (--ranks) has a trace here", source.path
            )
    return scans


def load(
    path: str | Path,
    options: ReadOptions | None = None,
    *,
    cache_writer: Executor | None = None,
    executor: Executor | None = None,
    spill: Spill | None = None,
    progress: ReadProgress | None = None,
) -> Job:
    """Read everything the analysis needs from PATH (see the module docstring), as OPTIONS say
    (tracekit.ingest.read_options: which ranks, the topology, the cache, the workers).

    ``cache_writer``: where cache entries are written while the analysis runs; ``executor``: where
    the per-file parse runs (tracekit.engines). ``spill`` (tracekit.ingest.spill): where the
    ranks' events wait; default a new one in the system's temporary folder, owned by the Job (it
    is removed when the Job is). ``progress``: told (files read, files, bytes read, bytes)
    after each trace file is read (tracekit.ingest.rank_scan.ReadProgress).
    """
    options = options or ReadOptions()
    if options.cache:
        from tracekit.ingest import cache as cache_mod

        cache_mod.max_bytes()  # a bad TRACEKIT_CACHE_MAX_BYTES is an error, not ignored
    source = locate(path)
    selection = select(list(source.traces), options.ranks, options.sample, options.cache_dir)
    spill = spill if spill is not None else Spill()
    scans = read_selected(
        source, selection, options, spill, cache_writer=cache_writer, executor=executor,
        progress=progress,
    )  # fmt: skip
    side = sorted({s.info.rank for s in scans} | source.named_ranks())
    return assemble(
        source,
        selection,
        scans,
        (load_rank(source, r) for r in side),
        ranks_per_node=options.ranks_per_node,
        subset=options.subset,
        spill=spill,
    )
