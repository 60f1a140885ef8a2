"""The per-rank task: one trace file in, that rank's parsed result out, on any engine.

:func:`parse_rank` is what a worker runs (a thread, a spawned process or a Dask worker,
tracekit.engines): a top-level function of a path string, so that every engine can send it by
reference, and a result of (TraceInfo, events frame) exactly as ``read_trace`` returns it.
Workers read the trace from the path they share with the driver; the frame comes back through
the engine's own serialisation (Dask's, or the process pool's pickle of polars' IPC). No state
lives between tasks, so a task a dead worker left unfinished can run again anywhere.

:func:`parse_ranks` is the driver's side: the tasks through an Executor, results in path order,
and (``store``) each rank's cache entry written here, in the driver, keyed by the file as it
was before its task read it (tracekit.cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

import polars as pl

from tracekit.ingest.kineto import TraceInfo, read_trace


def parse_rank(path: str) -> tuple[TraceInfo, pl.DataFrame]:
    """Read one Kineto trace: (TraceInfo, events with EVENT_SCHEMA), as ``read_trace``."""
    return read_trace(Path(path))


def parse_ranks(
    executor: Executor,
    paths: Sequence[Path],
    cache_dir: Path | None = None,
    store: bool = False,
    writer: Executor | None = None,
) -> list[tuple[TraceInfo, pl.DataFrame]]:
    """:func:`parse_rank` of every path through ``executor``, in the order of ``paths``.

    ``store``: also write each rank's cache entry (by ``writer``, a one-thread executor its
    owner waits for, else before returning).
    """
    from tracekit import cache

    keys = [cache.key(Path(p)) for p in paths] if store else []
    results = list(executor.map(parse_rank, [str(p) for p in paths]))
    for p, want, (info, frame) in zip(paths, keys, results):
        if writer is not None:
            writer.submit(cache.store, Path(p), info, frame, cache_dir, want)
        else:
            cache.store(Path(p), info, frame, cache_dir, want)
    return results
