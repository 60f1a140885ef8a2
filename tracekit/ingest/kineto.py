"""Kineto (torch.profiler) traces in: :func:`read_trace` reads one file, :func:`read_traces` a
job's files in parallel, through the columnar cache.

One file passes through four steps, a module each: kineto_files (its JSON bytes, gunzipped
within a size limit), kineto_decode (the C scanner, or msgspec), kineto_classify (the events
table, tracekit.events) and kineto_info (TraceInfo: rank, process groups, devices, warnings).

:func:`read_traces` parses files in threads of this process, one per idle CPU, or, with three
idle CPUs or more and over 16 MiB of trace, in spawned worker processes (fork is unsafe once
polars' thread pool runs) whose frames come back as Arrow IPC bytes, metadata as JSON. It
refuses a defaulted rank when given several files; several files of one rank go to
tracekit.ingest.foreign (latest profiling cycle, or an error).

Given an engine's Executor (tracekit.engines: threads, spawned processes or a Dask cluster),
the per-rank task is :func:`parse_rank`: a top-level function of a path string, so that every
engine can send it by reference, whose result is (TraceInfo, events frame) exactly as
:func:`read_trace` returns it. Workers read the trace from the path they share with the driver;
the frame comes back through the engine's own serialisation (Dask's, or the process pool's
pickle of polars' IPC). No state lives between tasks, so a task a dead worker left unfinished can
run again anywhere. :func:`parse_ranks` is the driver's side: results in path order, each rank's
cache entry written in the driver, keyed by the file as it was before its task read it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import stopping
from tracekit.errors import TracekitError
from tracekit.ingest import cache as trace_cache
from tracekit.ingest import devices
from tracekit.ingest.foreign import file_facts, select_traces
from tracekit.ingest.kineto_classify import events_frame
from tracekit.ingest.kineto_decode import Decoded, decode_trace
from tracekit.ingest.kineto_files import pin_mmap_threshold, read_bytes
from tracekit.ingest.kineto_info import (
    TraceInfo,
    choose_rank,
    count_steps,
    decode_info,
    encode_info,
    memory_peaks,
    trace_meta,
    uniform_group_size,
)

_POOL_MIN_BYTES = 16 * 2**20  # below this much trace on disk, worker start-up costs more
_POOL_MIN_CPUS = 3  # two workers bought 13 % of wall time for 65 % more memory


def read_trace(path: Path, rank: int | None = None) -> tuple[TraceInfo, pl.DataFrame]:
    """Read one Kineto trace (``.json`` or gzip) into (metadata, events with EVENT_SCHEMA).

    ``rank`` is used only when the trace has no ``distributedInfo.rank``; a file name's
    ``rank<N>`` comes next, then rank 0 with a warning. Any problem with the file is a
    TracekitError naming it.
    """
    path = Path(path)
    return _read_decoded(decode_trace(read_bytes(path), path), path, rank)


def _read_decoded(decoded: Decoded, path: Path, rank: int | None) -> tuple[TraceInfo, pl.DataFrame]:
    """Metadata and events of one decoded trace (either decoding path)."""
    warnings: list[str] = []
    meta = trace_meta(decoded.top, warnings)
    chosen, source = choose_rank(path, meta.pop("rank"), rank, warnings)
    group_size = uniform_group_size(meta["pg_config"])
    frame = events_frame(decoded, chosen, meta["base_ns"], group_size, warnings, path)
    warnings.extend(devices.device_warnings(frame, meta["device_properties"]))
    info = TraceInfo(
        path=path,
        rank=chosen,
        rank_source=source,
        **meta,
        has_gpu=bool(frame["cat"].is_in(devices.WORK_CATS).any()),
        profiler_steps=count_steps(frame),
        warnings=tuple(warnings),
        memory_peak_bytes=memory_peaks(decoded.memory_args, path),
    )
    return info, frame


def _parse_one(
    path: Path, cache_dir: Path | None, store: bool, writer: Any = None
) -> tuple[TraceInfo, pl.DataFrame]:
    """read_trace, then (``store``) its cache entry, keyed by the file as it was before reading.

    ``writer`` (a one-thread executor) writes the entry in the background: polars encodes
    parquet without the GIL, so it overlaps with decoding the next file.
    """
    if not store:
        return read_trace(path)
    want = trace_cache.key(path)
    info, frame = read_trace(path)
    store_entry(path, info, frame, cache_dir, want, writer)
    return info, frame


def store_entry(
    path: Path,
    info: TraceInfo,
    frame: pl.DataFrame,
    cache_dir: Path | None,
    want: dict[str, Any] | None,
    writer: Executor | None,
) -> None:
    """PATH's cache entry under the key WANT it had before it was read: by WRITER when given."""
    if writer is not None:
        writer.submit(trace_cache.store, path, info, frame, cache_dir, want)
    else:
        trace_cache.store(path, info, frame, cache_dir, want)


def _work(path: str, cache_dir: str | None = None, store: bool = False) -> tuple[str, bytes, bytes]:
    """Worker task: ("ok", info JSON, events IPC) or ("error", message, path): bytes only.

    The frame travels as lz4-compressed Arrow IPC: ~10x smaller than plain IPC (a 30 MB rank
    is 2 MB on the pipe), for the same CPU.
    """
    pin_mmap_threshold()
    try:
        info, frame = _parse_one(Path(path), Path(cache_dir) if cache_dir else None, store)
    except TracekitError as err:
        message = str(err)
        prefix = f"{err.path}: " if err.path else ""
        return "error", message.removeprefix(prefix).encode(), (err.path or "").encode()
    return "ok", encode_info(info), frame.write_ipc(None, compression="lz4").getvalue()


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
    keys = [trace_cache.key(Path(p)) for p in paths] if store else []
    results = list(executor.map(parse_rank, [str(p) for p in paths]))
    for p, want, (info, frame) in zip(paths, keys, results):
        store_entry(Path(p), info, frame, cache_dir, want, writer)
    return results


def _cpus() -> int:
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def _idle_cpus() -> int:
    """CPUs this process may use minus the other processes running right now.

    The instantaneous count (/proc/loadavg's "running/total"), not the 1-minute average: that
    one still carries whatever ran just before (a previous command) for a minute after it ended.
    """
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1  # not us
    except (OSError, ValueError, IndexError):
        try:
            running = int(os.getloadavg()[0] + 0.5)
        except OSError:
            running = 0
    return max(1, _cpus() - max(running, 0))


def _default_workers(paths: list[Path]) -> int:
    """One per file up to the idle CPUs, given at least three; else none (parse here, one file
    at a time), and none for small inputs.

    A spawned worker costs ~0.4 CPU-s to start (a fresh interpreter importing polars) and holds
    its own libraries and one rank's parse in memory; results cross a pipe. Measured on a 2-core
    machine (benchmarks/README.md), 8 x 30 MB ranks: two workers on idle cores took 4.5 s
    instead of 5.2 s, for 20 % more CPU and 65 % more memory over the process tree (658 MB
    instead of about 400); on busy cores they took longer. With three or more idle CPUs the
    parse, the bulk of a cold analysis, divides among them.
    """
    total = sum(p.stat().st_size for p in paths if p.is_file())
    idle = _idle_cpus()
    if total < _POOL_MIN_BYTES or idle < _POOL_MIN_CPUS:
        return 1
    return min(len(paths), idle)


def _spawn_can_start() -> bool:
    """False when spawned workers could not re-import ``__main__`` (code fed on stdin)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return True
    main_path = getattr(main, "__file__", None)
    return main_path is None or os.path.isfile(main_path)


def _parse_here(
    paths: list[Path],
    threads: int,
    cache_dir: Path | None,
    store: bool,
    writer: Executor | None = None,
) -> list[tuple[TraceInfo, pl.DataFrame]]:
    """Parse in this process, ``threads`` files at a time.

    Threads pay off because the heavy parts release the GIL: gunzip, the C scan and polars.
    Memory holds the JSON of ``threads`` ranks at a time, results come back in file order.
    Cache entries are written by ``writer`` (left running: its owner waits for it), else by a
    writer thread of our own that we wait for.
    """
    pin_mmap_threshold()
    with ExitStack() as stack:
        if store and writer is None:
            writer = stack.enter_context(stopping.ThreadPool(1, "tracekit-cache"))
        pool = stack.enter_context(stopping.ThreadPool(threads, "tracekit-parse"))
        return list(
            pool.map(lambda p: _parse_one(p, cache_dir, store, writer if store else None), paths)
        )


def _parse_all(
    paths: list[Path],
    workers: int,
    cache_dir: Path | None = None,
    store: bool = False,
    writer: Executor | None = None,
) -> list[tuple[TraceInfo, pl.DataFrame]]:
    """Parse each file in a spawned worker (fork is unsafe once polars' threads run).

    Results are collected as they come (``imap``-style, one file per task), so the parent
    holds the compact frames of finished ranks and each worker the raw JSON of one rank at a
    time: memory is bounded by ``workers`` ranks of JSON, not the job's.
    """
    if workers <= 1 or not _spawn_can_start():
        return _parse_here(paths, min(len(paths), _idle_cpus()), cache_dir, store, writer)
    ctx = multiprocessing.get_context("spawn")
    out = []
    try:
        with stopping.ProcessPool(workers, ctx) as pool:
            n = len(paths)
            for status, first, second in pool.map(
                _work,
                [str(p) for p in paths],
                [str(cache_dir) if cache_dir else None] * n,
                [store] * n,
            ):
                if status == "error":
                    raise TracekitError(first.decode(), second.decode() or None)
                out.append((decode_info(first), pl.read_ipc(second)))
    except BrokenProcessPool:
        raise TracekitError(
            "a worker process died while reading traces (out of memory, or a script that calls "
            "tracekit without an `if __name__ == '__main__':` guard); try workers=1"
        ) from None
    return out


def _check_ranks(infos: list[TraceInfo]) -> None:
    """A defaulted rank among several files is an error; several files of one rank are sorted
    out by tracekit.ingest.foreign (profiling cycles, clashes, mixed jobs)."""
    for info in infos:
        if len(infos) > 1 and info.rank_source == "default":
            raise TracekitError(
                "no rank in distributedInfo or file name, and several trace "
                "files were given: name it rank<N>",
                info.path,
            )


def read_traces(
    paths: Sequence[Path],
    workers: int | None = None,
    *,
    cache: bool | None = False,
    cache_dir: Path | None = None,
    cache_writer: Executor | None = None,
    executor: Executor | None = None,
) -> tuple[list[TraceInfo], pl.DataFrame]:
    """Read several ranks' traces in parallel: infos sorted by rank, one events frame.

    ``workers``: worker processes, one file per task; default one per file up to the usable
    CPUs, or none (parse here) when the files to parse total under 16 MiB; 1 parses here. One
    file is always parsed here and its rank may default to 0 with a warning; several files each
    need a rank of their own; several files of one rank are the latest profiling cycle
    (warning), or an error (same time, other process, mixed jobs: tracekit.ingest.foreign).

    ``cache`` (tracekit.ingest.cache): False ignores it; None reads matching entries (beside each
    trace, or in ``cache_dir``) and parses the rest; True also writes an entry for every file
    it had to parse: in the background when ``cache_writer`` (an executor its owner waits for)
    is given, else before returning.

    ``executor`` (tracekit.engines: threads, processes or a Dask cluster): run the per-rank
    parse there (:func:`parse_ranks`) instead of choosing ``workers`` here.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise TracekitError("no trace files to read")
    hits: dict[Path, tuple[TraceInfo, pl.DataFrame]] = {}
    if cache is not False:
        for p in paths:
            found = trace_cache.load(p, cache_dir)
            if found is not None:
                hits[p] = found
    todo = [p for p in paths if p not in hits]
    if todo and executor is not None:
        store = cache is True
        hits.update(zip(todo, parse_ranks(executor, todo, cache_dir, store, cache_writer)))
    elif todo:
        if workers is None:
            workers = _default_workers(todo)
        parsed_now = _parse_all(
            todo, min(workers, len(todo)), cache_dir, store=cache is True, writer=cache_writer
        )
        hits.update(zip(todo, parsed_now))
    parsed = [hits[p] for p in paths]
    _check_ranks([info for info, _ in parsed])
    parsed = select_traces(parsed, [file_facts(info, frame) for info, frame in parsed])
    parsed.sort(key=lambda pair: pair[0].rank)
    frames = [frame for _, frame in parsed]
    return [info for info, _ in parsed], pl.concat(frames, how="vertical", rechunk=False)
