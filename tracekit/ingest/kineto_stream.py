"""One big trace read in bounded memory (issue #29): its JSON in slices, its events in parts.

The held read (tracekit.ingest.kineto) holds a rank's whole JSON, the scanner's columns and the
events table at once: about 2.2x the JSON at its peak. A rank whose JSON is larger than
``$TRACEKIT_RANK_MEMORY`` (bytes, ``k``/``m``/``g`` suffixes; default 256 MiB: traces smaller
than that take the held read, unchanged) is read here instead:

1. the (gunzipped) stream is read in blocks of a quarter of that setting (1 to 64 MiB); the
   C scanner's ``split`` finds where the last whole element of ``traceEvents`` in the buffer
   ends, and that run of events, wrapped as ``{"traceEvents": [...]}``, is scanned whole by the
   same scanner the held read uses (kineto_decode). Each slice's raw columns go to a parquet
   part in the spill folder; kept in memory are only what the events table needs from the
   whole file: the header and tail keys (distributedInfo, baseTimeNanoseconds, which Kineto
   writes after the events), the thread-name and memory events, and the args of the few rows
   that are collectives;
2. each part is then made into its slice of the events table by kineto_classify, exactly as
   the held read makes the whole (every rule there is a function of the row, the file's header
   and its thread names), written as a part of the rank's events, and reduced into what the
   driver keeps (the slim rows, file facts, coverage flags, TraceInfo).

Anything this path is not certain to read exactly like the held read (the scanner declines a
slice, no ``traceEvents`` array where Kineto puts it, a malformed header or tail) gives None:
the caller then takes the held read, which reads or words the file as always.
"""

from __future__ import annotations

import os
import re
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from tracekit import guarded_read
from tracekit.errors import TracekitError
from tracekit.events import empty_events
from tracekit.ingest import devices, foreign, kineto_classify
from tracekit.ingest.kineto_decode import Decoded, _decode, _decoded_fast
from tracekit.ingest.kineto_files import _DEFLATE_MAX_RATIO, _too_big, max_trace_bytes
from tracekit.ingest.kineto_info import (
    TraceInfo,
    choose_rank,
    count_steps,
    memory_peaks,
    trace_meta,
    uniform_group_size,
)
from tracekit.ingest.rank_memory import block_bytes, rank_memory

try:
    from tracekit.ingest import _kscan
except ImportError:  # no C scanner: every trace takes the held read (rank_memory says so)
    _kscan = None  # type: ignore[assignment]

_PIECE = 4 * 2**20  # JSON per read or zlib call
_HEAD_MAX = 16 * 2**20  # header or tail keys beyond this: not a Kineto layout; the held read
_WS = b" \t\r\n"


def _blocks(path: Path) -> Iterator[bytes]:
    """The file's JSON in pieces of up to 4 MiB (gunzipped, every member), within
    kineto_files.max_trace_bytes as the held read is."""
    limit, why = max_trace_bytes()
    total = 0
    with os.fdopen(guarded_read.open_regular(path), "rb") as f:  # regular files only
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if not gz:
            if os.fstat(f.fileno()).st_size > limit:
                raise _too_big(os.fstat(f.fileno()).st_size, limit, why, path)
            while piece := f.read(_PIECE):
                yield piece
            return
        _refuse_early(f, limit, why, path)
        d = zlib.decompressobj(wbits=31)
        try:
            while True:
                if d.eof:  # the next member, unless only zero padding is left (as kineto_files)
                    rest = d.unused_data
                    while not rest.strip(b"\0") and (more := f.read(1 << 16)):
                        rest += more
                    if not rest.strip(b"\0"):
                        break
                    d, piece = zlib.decompressobj(wbits=31), rest
                else:
                    piece = d.unconsumed_tail or f.read(1 << 16)
                    if not piece:
                        raise TracekitError(
                            "truncated gzip file (it ends before its end marker)", path
                        )
                part = d.decompress(piece, _PIECE)
                total += len(part)
                if total > limit:
                    raise _too_big(total, limit, why, path, gz=True, at_least=True)
                if part:
                    yield part
        except zlib.error as exc:
            raise TracekitError(f"corrupt gzip data ({exc})", path) from None


def _refuse_early(f: BinaryIO, limit: int, why: str, path: Path) -> None:
    """The held read's refusals of a gzip before reading it (kineto_files._read_now): a file
    over the limit, or a trailer stating a size over it that deflate could reach."""
    size = os.fstat(f.fileno()).st_size
    if size > limit:
        raise _too_big(size, limit, why, path, gz=True, at_least=True)
    if size >= 18:
        f.seek(-4, os.SEEK_END)
        stated = int.from_bytes(f.read(4), "little")
        if limit < stated <= _DEFLATE_MAX_RATIO * size:
            raise _too_big(stated, limit, why, path, gz=True)
        f.seek(0)


def _events_start(buf: bytes | bytearray) -> int | None:
    """Just after the ``[`` of the top-level ``"traceEvents"`` in BUF, or None when BUF does
    not start ``{ ... "traceEvents": [`` with the key at depth 1 (outside any string)."""
    at = buf.find(b'"traceEvents"')
    if at < 0 or not buf[:at].lstrip(_WS).startswith(b"{"):
        return None
    depth, in_str, esc = 0, False, False
    for c in buf[:at]:
        if in_str:
            esc, in_str = (False, in_str) if esc else (c == 0x5C, c != 0x22)
        elif c == 0x22:
            in_str = True
        elif c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
    if depth != 1 or in_str:
        return None
    rest = bytes(buf[at + len(b'"traceEvents"') : at + 64]).lstrip(_WS)
    if not rest.startswith(b":") or not rest[1:].lstrip(_WS).startswith(b"["):
        return None
    return buf.index(b"[", at) + 1


@dataclass
class Streamed:
    """One trace read here: what tracekit.ingest.rank_scan keeps of it."""

    info: TraceInfo
    parts: tuple[str, ...]
    slim: pl.DataFrame
    facts: dict[str, Any]
    flags: pl.DataFrame


@dataclass
class _Raw:
    """Pass 1's result: the header and tail, the raw parts and what they need of the file."""

    top_doc: bytes
    parts: list[tuple[str, dict[int, bytes]]]  # raw part file, args of its collective rows
    threads: list[pl.DataFrame]
    thread_args: list[bytes]
    memory_args: list[bytes]


def _collective_rows(xframe: pl.DataFrame) -> pl.Series:
    """``i`` of the rows that have a collective family: the only ones whose args are read."""
    canon = devices.canonical_cats(xframe)
    classes = kineto_classify._classes(canon)
    keys = kineto_classify._CLASS_KEYS
    fam = classes.filter(pl.col("family").is_not_null()).select(keys)
    return canon.join(fam, on=keys, how="semi", nulls_equal=True)["i"]


def _slice(doc: bytearray, path: Path, folder: Path, raw: _Raw) -> bool:
    """One slice ``{"traceEvents": [...]}`` scanned, its raw part written: False if declined."""
    decoded = _decoded_fast(doc, path)
    if decoded is None:
        return False
    raw.threads.append(decoded.threads)
    raw.thread_args.extend(bytes(a) for a in decoded.thread_args)
    raw.memory_args.extend(bytes(a) for a in decoded.memory_args)
    xframe = decoded.xframe
    args = {int(i): bytes(decoded.raw_args(int(i))) for i in _collective_rows(xframe)}
    if xframe.height:
        part = str(folder / f"raw-{len(raw.parts):05d}.parquet")
        xframe.write_parquet(part, compression="lz4", statistics=False)
        raw.parts.append((part, args))
    return True


_PREFIX = b'{"traceEvents": ['


def _pass_one(path: Path, folder: Path, block: int) -> _Raw | None:
    """The events in slices of about BLOCK bytes, each scanned where it lies: the buffer is
    ``{"traceEvents": [`` + the events not yet scanned, and a slice is scanned as the buffer
    cut after its last whole event, with ``]}`` put after it (so no copy of the slice)."""
    raw = _Raw(b"", [], [], [], [])
    buf, p = bytearray(), len(_PREFIX)
    head: bytes | None = None
    first, closed = True, False
    pieces = _blocks(path)
    for data in pieces:
        buf += data
        if head is None:  # still looking for the events array
            start = _events_start(buf)
            if start is None:
                if len(buf) > _HEAD_MAX:
                    return None
                continue
            head = bytes(buf[: buf.index(b'"traceEvents"')])
            buf[:start] = _PREFIX
        if len(buf) - p < block:
            continue
        end, closed = _kscan.split(buf, p)
        if end == p and not closed:
            continue  # no whole event yet (one event longer than a block)
        if not _take(buf, end, first, closed, path, folder, raw):
            return None
        first = False
        if closed:
            break
    else:  # the stream has ended: what is left holds the rest of the events, or not
        if head is None:
            return None
        end, closed = _kscan.split(buf, p)
        if not closed or not _take(buf, end, first, closed, path, folder, raw):
            return None
    tail = bytes(buf[p + 1 :])  # _take left the buffer as prefix + "]" + what follows it
    for data in pieces:  # the tail keys after the array
        tail += data
        if len(tail) > _HEAD_MAX:
            return None
    raw.top_doc = head + b'"traceEvents": []' + tail
    return raw


def _take(
    buf: bytearray, end: int, first: bool, closed: bool, path: Path, folder: Path, raw: _Raw
) -> bool:
    """Scan the events in ``buf[len(_PREFIX):end]`` (after the first slice, they start with
    the comma that followed the last one: blanked) and leave BUF as the prefix and what
    followed END; False when the slice is not JSON the scanner reads."""
    p = len(_PREFIX)
    a = p
    while a < end and buf[a] in _WS:
        a += 1
    if not first:  # between the last slice and this one: exactly one comma
        if a < end and buf[a] == 0x2C:
            buf[a] = 0x20
            a += 1
            while a < end and buf[a] in _WS:
                a += 1
            if a == end:
                return False  # a trailing comma before "]": not JSON
        elif a < end:
            return False
    rest = bytes(buf[end:])  # a part of one event (or "]" and the tail): small
    if a < end:
        del buf[end:]
        buf += b"]}"
        if not _slice(buf, path, folder, raw):
            return False
    del buf[p:]
    buf += rest
    return True


_COUNTED = [  # events_frame's warnings that count rows: summed over the parts, in this order
    re.compile(r"^dropped \d+ events with missing"),
    re.compile(r"^dropped \d+ events whose times"),
    re.compile(r"^bytes left null for \d+ "),
]


def _merged(warnings: list[list[str]]) -> list[str]:
    """The parts' warnings as the whole file's: counted ones summed, in events_frame's order."""
    sums: dict[int, tuple[str, int]] = {}
    other: list[str] = []
    for lines in warnings:
        for line in lines:
            k = next((k for k, r in enumerate(_COUNTED) if r.match(line)), None)
            if k is None:
                other += [] if line in other else [line]
                continue
            n = int(re.findall(r"\d+", line)[0])
            sums[k] = (line, sums.get(k, (line, 0))[1] + n)
    out = [re.sub(r"\d+", str(n), line, count=1) for _, (line, n) in sorted(sums.items())]
    return out + other


def _pid(counts: list[pl.DataFrame]) -> str | None:
    """foreign._pid over the parts: the most frequent numeric CPU pid, the least of ties."""
    table = pl.concat(counts).group_by("pid").agg(pl.col("n").sum())
    if not table.height:
        return None
    best = table["n"].max()
    return str(table.filter(pl.col("n") == best)["pid"].sort()[0])


def read_streamed(path: Path, folder: str | Path, setting: int | None = None) -> Streamed | None:
    """PATH read in bounded memory into parts in FOLDER (module docstring); None to take the
    held read instead."""
    path = Path(path)
    block = block_bytes(rank_memory() if setting is None else setting)
    where = Path(folder) / f"stream-{uuid.uuid4().hex}"
    where.mkdir()
    done: Streamed | None = None
    try:
        raw = _pass_one(path, where, block)
        if raw is not None:
            try:
                top = _decode(raw.top_doc, path)
            except TracekitError:
                return None  # the held read words it
            done = _pass_two(path, where, top, raw)
        return done
    except OSError as exc:
        raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    finally:  # the raw parts always, and the folder unless it holds the events: all made here
        for f in where.glob("raw-*.parquet"):
            f.unlink()
        if done is None:
            for f in where.glob("events-*.parquet"):
                f.unlink()
            where.rmdir()


def _pass_two(path: Path, where: Path, top: Any, raw: _Raw) -> Streamed:
    warnings: list[str] = []
    meta = trace_meta(top, warnings)
    chosen, source = choose_rank(path, meta.pop("rank"), None, warnings)
    group_size = uniform_group_size(meta["pg_config"])
    threads = pl.concat(raw.threads) if raw.threads else pl.DataFrame()
    parts, slims, flags, pids, steps, cats = [], [], [], [], [], []
    part_warnings: list[list[str]] = []
    lo: list[Any] = []
    hi: list[Any] = []
    has_work = False
    for k, (file, args) in enumerate(raw.parts):
        xframe = pl.read_parquet(file)
        decoded = Decoded(top, xframe, lambda i: args.get(i, b""), threads, raw.thread_args, [])
        w: list[str] = []
        frame = kineto_classify.events_frame(decoded, chosen, meta["base_ns"], group_size, w, path)
        del xframe, decoded
        os.unlink(file)
        part_warnings.append(w)
        out = str(where / f"events-{k:05d}.parquet")
        frame.write_parquet(out, compression="lz4", statistics=False)
        parts.append(out)
        slims.append(frame.filter(_slim()))
        flags.append(foreign.coverage_flags(frame))
        if frame.height:
            lo.append(frame["start_ns"].min())
            hi.append(frame["end_ns"].max())
        cpu = frame.filter((pl.col("device") == "cpu") & pl.col("pid").str.contains(r"^\d+$"))
        pids.append(cpu.group_by("pid").agg(pl.len().alias("n")))
        steps.append(frame.filter(pl.col("name").str.starts_with("ProfilerStep#")))
        has_work = has_work or bool(frame["cat"].is_in(devices.WORK_CATS).any())
        cats.append(_device_rows(frame))
    if not parts:
        warnings.append("no complete (ph 'X') events")
    warnings.extend(_merged(part_warnings))
    sample = _device_sample(cats, has_work)
    warnings.extend(devices.device_warnings(sample, meta["device_properties"]))
    empty = empty_events()
    info = TraceInfo(
        path=path,
        rank=chosen,
        rank_source=source,
        **meta,
        has_gpu=has_work,
        profiler_steps=count_steps(pl.concat(steps) if steps else empty),
        warnings=tuple(warnings),
        memory_peak_bytes=memory_peaks(raw.memory_args, path),
    )
    flag = (
        pl.concat(flags).group_by("rank", maintain_order=True).agg(pl.all().any())
        if flags
        else foreign.coverage_flags(empty)
    )
    facts = {
        "start": min(lo) if lo else None,
        "end": max(hi) if hi else None,
        "host": info.host_name,
        "clock": (info.host_name, info.base_ns is not None),
        "pid": _pid(pids) if pids else None,
    }
    slim = pl.concat(slims) if slims else empty.filter(_slim())
    return Streamed(info, tuple(parts), slim, facts, flag)


def _device_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """What devices.device_warnings reads (cat, name) of a part, as counts: the rows of unknown
    categories, of runtime calls and CUPTI ranges, and of work (one row says there is some)."""
    cat = pl.col("cat")
    known = cat.is_in(list(devices.KNOWN_CATS)) | (cat == "Trace")
    keep = ~known | cat.is_in(list(devices.RUNTIME_CATS)) | (cat == "cuda_profiler_range")
    rows = frame.filter(keep).group_by("cat", "name").agg(pl.len().alias("n"))
    work = (
        frame.filter(cat.is_in(list(devices.WORK_CATS)))
        .head(1)
        .select("cat", "name", pl.lit(1, dtype=pl.UInt32).alias("n"))
    )
    return pl.concat([rows.with_columns(pl.col("n").cast(pl.UInt32)), work])


def _device_sample(counts: list[pl.DataFrame], has_work: bool) -> pl.DataFrame:
    """The rows behind COUNTS (cat, name), each as often as counted; with work, the runtime
    rows are not read (device_warnings stops at the work), so one row of each stands in."""
    if not counts:
        return empty_events().select("cat", "name")
    table = pl.concat(counts).group_by("cat", "name", maintain_order=True).agg(pl.col("n").sum())
    if has_work:
        table = table.with_columns(
            pl.when(pl.col("cat").is_in(list(devices.KNOWN_CATS)) | (pl.col("cat") == "Trace"))
            .then(1)
            .otherwise(pl.col("n"))
            .alias("n")
        )
    return table.select(
        pl.col("cat").repeat_by("n").explode(), pl.col("name").repeat_by("n").explode()
    )


def _slim() -> pl.Expr:
    return kineto_classify.SLIM
