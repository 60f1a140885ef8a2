"""The per-rank read (the map's first step): one trace file -> a small :class:`RankScan`.

The driver never holds every rank's events (issue #17): each file is read where a task runs
(threads here, spawned processes, or a Dask worker: tracekit.engines), and what comes back is

- its TraceInfo, the facts tracekit.ingest.foreign needs to choose among files of one rank,
  and its coverage flags (foreign.coverage_flags);
- ``slim``: the few events the cross-rank steps read: communication calls and kernels (matched
  across ranks, tracekit.analyses.collectives), annotations (step markers, our comm:* and
  pipeline labels, FSDP's), about one event in two hundred of a GPU trace;
- ``events``: where the rest waits for the per-rank timeline step (tracekit.ingest.spill): held
  in memory within the driver's budget, else a parquet file (the cache entry when there is one,
  else one written into the analysis's scratch folder).

Tasks are top-level functions of strings and numbers, so every engine sends them by reference.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import stopping
from tracekit.errors import TracekitError
from tracekit.events import empty_events
from tracekit.ingest import cache as trace_cache
from tracekit.ingest import foreign, kineto, kineto_classify, kineto_stream
from tracekit.ingest.cache_paths import candidates
from tracekit.ingest.kineto import _check_ranks, _default_workers, _idle_cpus, _spawn_can_start
from tracekit.ingest.kineto_files import pin_mmap_threshold
from tracekit.ingest.kineto_info import TraceInfo
from tracekit.ingest.rank_memory import should_stream
from tracekit.ingest.read_options import ReadOptions
from tracekit.ingest.spill import EventsRef, Spill, write

#: the rows the cross-rank steps read (module docstring): the rest stays with the rank
SLIM = kineto_classify.SLIM  # the events the cross-rank steps read (defined beside the kinds)


@dataclass(frozen=True)
class RankScan:
    """One trace file, read: what the driver keeps of it (module docstring)."""

    info: TraceInfo
    """What the file says about itself."""
    slim: pl.DataFrame
    """Its events that the cross-rank steps read (:data:`SLIM`), in file order."""
    events: EventsRef
    """Every event of the file (tracekit.events.EVENT_SCHEMA), held or in a parquet file."""
    facts: dict[str, Any]
    """foreign.file_facts: time range, host, process id."""
    flags: pl.DataFrame
    """foreign.coverage_flags of its events: one row."""


def digest(info: TraceInfo, frame: pl.DataFrame, events: EventsRef) -> RankScan:
    """The RankScan of a file whose events FRAME are kept at EVENTS."""
    return RankScan(
        info=info,
        slim=frame.filter(SLIM),
        events=events,
        facts=foreign.file_facts(info, frame),
        flags=foreign.coverage_flags(frame),
    )


def _scan(
    trace: Path,
    folder: Callable[[], str | Path],
    hold: Callable[[int], bool],
    cache_dir: Path | None,
    use_cache: bool,
    store: bool,
    writer: Executor | None = None,
) -> RankScan:
    """Read TRACE: from its matching cache entry when ``use_cache`` finds one (beside it, a
    rank's ingest at source, or in the cache folder: then the entry is where its events wait),
    else parsed. Its events are held when ``hold`` (the driver's budget) takes their size, else
    kept in the cache entry written for it (``store``) or in a new file in ``folder()`` (made
    on first use)."""
    if use_cache:
        found = trace_cache.lookup(trace, cache_dir)
        loaded = trace_cache.load(trace, cache_dir, want=found[1]["key"]) if found else None
        if found and loaded is not None:
            info, frame = loaded
            held = hold(int(frame.estimated_size()))
            ref = EventsRef(frame=frame) if held else EventsRef(path=str(found[0]))
            return digest(info, frame, ref)
    want = trace_cache.key(trace) if store else None
    if should_stream(trace):  # bigger than $TRACEKIT_RANK_MEMORY: in parts
        streamed = kineto_stream.read_streamed(trace, folder())
        if streamed is not None:
            s = streamed  # no X events, no parts: an empty frame, held
            ref = EventsRef(parts=s.parts) if s.parts else EventsRef(frame=empty_events())
            if store:  # the entry streamed from the parts, which stay where the events wait
                trace_cache.store(trace, s.info, ref.lazy(), cache_dir, want)
            return RankScan(s.info, s.slim, ref, s.facts, s.flags)
    info, frame = kineto.read_trace(trace)
    if hold(int(frame.estimated_size())):
        if store:  # held, and the entry written (in the background when there is a writer)
            kineto.store_entry(trace, info, frame, cache_dir, want, writer)
        return digest(info, frame, EventsRef(frame=frame))
    entry = trace_cache.store(trace, info, frame, cache_dir, want) if store else None
    ref = EventsRef(path=str(entry)) if entry is not None else write(frame, folder(), "events")
    return digest(info, frame, ref)


def scan_file(
    path: str,
    folder: str,
    cache_dir: str | None = None,
    use_cache: bool = False,
    store: bool = False,
) -> RankScan:
    """The engine task: read PATH (from its cache entry when ``use_cache`` finds one) and leave
    its events in that entry, in the one written for it (``store``) or in a new file in FOLDER
    (a scratch folder the driver shares): nothing of them comes back but the slim rows."""
    pin_mmap_threshold()
    where = Path(cache_dir) if cache_dir else None
    return _scan(Path(path), lambda: folder, _never, where, use_cache, store)


def _never(nbytes: int) -> bool:
    return False


#: told after each file is read: (files read, files, bytes read, bytes) -- the bytes on disk
ReadProgress = Callable[[int, int, int, int], None]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # the read says what is wrong with it
        return 0


def _told(
    scans: Iterable[RankScan], sizes: list[int], progress: ReadProgress | None
) -> list[RankScan]:
    """The scans as they arrive, each one told to ``progress``."""
    out, done = [], 0
    for i, scan in enumerate(scans):
        out.append(scan)
        done += sizes[i]
        if progress is not None:
            progress(i + 1, len(sizes), done, sum(sizes))
    return out


def scan_traces(
    paths: Sequence[Path],
    spill: Spill,
    options: ReadOptions,
    *,
    cache_writer: Executor | None = None,
    executor: Executor | None = None,
    progress: ReadProgress | None = None,
) -> list[RankScan]:
    """Every file read (one task each), one per rank (foreign.select_traces), sorted by rank.

    ``executor`` (tracekit.engines): the tasks run there and spill into ``spill``'s folder,
    which the workers must share. Without one: threads here, or spawned processes when
    ``options.workers`` (default: kineto's rule, three idle CPUs and 16 MiB of trace) says so.
    ``options.cache``/``cache_dir`` and ``cache_writer``: as tracekit.ingest.kineto.read_traces.
    """
    workers, cache, cache_dir = options.workers, options.cache, options.cache_dir
    paths = [Path(p) for p in paths]
    if not paths:
        raise TracekitError("no trace files to read")
    store, use_cache = cache is True, cache is not False
    # worker processes pay off for parsing, not for reading cache entries back
    unparsed = [
        p for p in paths if not (use_cache and any(e.is_file() for e in candidates(p, cache_dir)))
    ]
    n = min(workers if workers is not None else _default_workers(unparsed), len(paths))
    sizes = [_size(p) for p in paths]
    if executor is not None:
        scans = _told(_remote(executor, paths, spill, cache_dir, use_cache, store), sizes, progress)
    elif n > 1 and _spawn_can_start():
        from tracekit.engines import open_executor

        with open_executor("processes", n) as (pool, _):
            remote = _remote(pool, paths, spill, cache_dir, use_cache, store)
            scans = _told(remote, sizes, progress)
    else:
        pin_mmap_threshold()
        threads = max(1, min(len(paths), _idle_cpus()))
        with stopping.ThreadPool(threads, "tracekit-parse") as pool:
            scans = _told(
                pool.map(
                    lambda p: _scan(
                        p, lambda: spill.folder, spill.hold, cache_dir, use_cache, store,
                        cache_writer,
                    ),
                    paths,
                ),
                sizes,
                progress,
            )  # fmt: skip
    _check_ranks([s.info for s in scans])
    chosen = foreign.select_traces([(s.info, s) for s in scans], [s.facts for s in scans])
    # select_traces notes on the info the files of a rank it chose among
    return sorted((replace(s, info=info) for info, s in chosen), key=lambda s: s.info.rank)


def _remote(
    executor: Executor,
    paths: list[Path],
    spill: Spill,
    cache_dir: Path | None,
    use_cache: bool,
    store: bool,
) -> Iterator[RankScan]:
    # absolute, made here in the driver: a Dask worker runs in a working directory of its own,
    # where `runs/x/traces/rank0.json.gz` names nothing (issue #25)
    n = len(paths)
    folder = os.path.abspath(spill.folder)
    return iter(
        executor.map(
            scan_file,
            [os.path.abspath(p) for p in paths],
            [folder] * n,
            [os.path.abspath(cache_dir) if cache_dir else None] * n,
            [use_cache] * n,
            [store] * n,
        )
    )
