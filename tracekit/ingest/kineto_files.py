"""Opening a trace file: its JSON bytes, gunzipped once into one buffer, within a size limit.

A trace is refused before it is read when it is larger than :func:`max_trace_bytes` (plain
JSON: the file's size; gzip: the size its trailer states, then the output while it streams, so
a gzip bomb or a lying trailer stops at the limit: docs/bad-input.md). Only regular files are
read (a FIFO must not block us). :func:`read_head` reads the first 64 KB of JSON, for the
readers that look at a trace without parsing it (rank selection, foreign JSON files).

:func:`read_bytes` hands out what :func:`prefetch` read ahead (tracekit.ingest.read_ahead), when
it did. Nothing here imports polars.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracekit import guarded_read
from tracekit.errors import TracekitError
from tracekit.ingest import read_ahead

MAX_BYTES_ENV = "TRACEKIT_MAX_TRACE_BYTES"
#: parsing holds about 6.7 bytes of memory per byte of JSON (peak RSS growth measured on
#: nccl_data.json.gz); the default limit leaves room for the analysis after it
_MEMORY_PER_JSON_BYTE = 8
_DEFLATE_MAX_RATIO = 1032
_HINT_MAX_RATIO = 64  # trace JSON gzips 10-20x
_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, capped by a cgroup v2 limit."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit.isdigit() and avail is not None:
            avail = min(avail, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return avail


def max_trace_bytes() -> tuple[int, str]:
    """(largest JSON size, uncompressed, that one trace may have; why that number)."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip().lower().removesuffix("b").removesuffix("i")
    if text:
        unit = text[-1] if text[-1] in "kmgt" else ""
        try:
            number = float(text.removesuffix(unit))
            if not math.isfinite(number) or number < 0:
                raise ValueError(text)
            value = int(number * _SUFFIXES[unit])  # inf would raise OverflowError here
        except (ValueError, OverflowError):
            raise TracekitError(
                f"{MAX_BYTES_ENV}={os.environ[MAX_BYTES_ENV]!r} is not a number of "
                "bytes (e.g. 2000000000 or 2G)"
            ) from None
        return value, f"{MAX_BYTES_ENV}"
    avail = _available_memory()
    if avail is None:
        return 2**62, "no memory limit known"
    return avail // _MEMORY_PER_JSON_BYTE, (
        f"1/{_MEMORY_PER_JSON_BYTE} of the {avail / 1e9:.1f} GB of available memory"
    )


def _too_big(
    size: int, limit: int, why: str, path: Path, *, gz: bool = False, at_least: bool = False
) -> TracekitError:
    amount = f"{'more than ' if at_least else ''}{size / 1e9:.2f} GB of JSON"
    return TracekitError(
        f"trace too large to parse on this machine: {amount}{' once uncompressed' if gz else ''}, "
        f"over the limit of {limit / 1e9:.2f} GB ({why}); set {MAX_BYTES_ENV} to change it, or "
        "analyse it on a machine with more memory",
        path,
    )


_MMAP_THRESHOLD = 4 << 20


@functools.lru_cache(maxsize=1)
def pin_mmap_threshold() -> None:
    """Make glibc give big buffers (a rank's JSON) back to the system when they are freed.

    glibc raises its mmap threshold to the largest block freed so far (up to 32 MB); from the
    second rank on, each rank's JSON then came from the heap, whose pages the process kept:
    pinning the threshold took 20 % off the peak RSS of a cold 8 x 30 MB analysis (430 -> 345
    MB) for about 8 % more wall time (the pages are faulted in again). A process-wide setting;
    a no-op where there is no glibc.
    """
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, _MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


#: compressed input per zlib call: a call that stops at the output cap keeps a copy of the input
#: it did not consume, so this bounds what is copied, and each call's output (~15x this) is
#: still in the CPU's caches when it is copied into the buffer
_GUNZIP_IN = 8 << 10
#: output per zlib call at most (deflate expands up to 1032x): a bomb gets at most this far past
#: the limit before it is stopped; under the mmap threshold, so these blocks reuse the heap
_GUNZIP_OUT = 2 << 20


@functools.lru_cache(maxsize=1)
def _libdeflate() -> Any:
    """libdeflate (the system's shared library, when it has one), set up for ctypes, or None.

    It inflates a whole gzip member in one call at about twice zlib's speed (35 ms instead of
    65 ms for a 30 MB trace here), without the GIL. Optional: zlib reads everything else.
    """
    import ctypes

    for name in ("libdeflate.so.0", "libdeflate.so", "libdeflate.dylib", "libdeflate.0.dylib"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None
    try:
        lib.libdeflate_alloc_decompressor.restype = ctypes.c_void_p
        lib.libdeflate_alloc_decompressor.argtypes = []
        lib.libdeflate_free_decompressor.argtypes = [ctypes.c_void_p]
        size = ctypes.c_size_t
        lib.libdeflate_gzip_decompress_ex.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            size,
            ctypes.c_void_p,
            size,
            ctypes.POINTER(size),
            ctypes.POINTER(size),
        ]
        lib.libdeflate_gzip_decompress_ex.restype = ctypes.c_int
    except AttributeError:  # a libdeflate too old for gzip_decompress_ex
        return None
    return lib


def _gunzip_whole(raw: bytes, size: int) -> bytearray | None:
    """RAW's gzip of exactly SIZE bytes by libdeflate, into a buffer of that size (so never
    more than SIZE): None when there is no libdeflate, or RAW is anything else (several members,
    another size, damage), which :func:`_gunzip`'s zlib path then reads or words."""
    lib = _libdeflate()
    if lib is None or size <= 0:
        return None
    import ctypes

    out = bytearray(size)
    used, made = ctypes.c_size_t(), ctypes.c_size_t()
    state = lib.libdeflate_alloc_decompressor()
    if not state:
        return None
    try:
        target = (ctypes.c_char * size).from_buffer(out)
        status = lib.libdeflate_gzip_decompress_ex(
            state, raw, len(raw), target, size, ctypes.byref(used), ctypes.byref(made)
        )
        del target  # the buffer's export, so that it can be resized later
    finally:
        lib.libdeflate_free_decompressor(state)
    rest = len(raw) - used.value
    if status != 0 or made.value != size or raw.count(b"\0", used.value) != rest:
        return None
    return out


def _gunzip(raw: bytes, limit: int, why: str, path: Path, size_hint: int = 0) -> bytearray:
    """Decompress every gzip member into one buffer, never producing more than ``limit`` bytes.

    The buffer starts at ``size_hint`` (the trailer's stated size, when likely) and grows when
    the hint was short. The input goes in as 8 KB slices of ``raw``: fed whole, every call that
    stopped at the output cap re-copied the rest of the input (and with the pinned mmap
    threshold each copy faulted in fresh pages): 1.8x the time of one ``zlib.decompress`` of a
    141 MB trace, where slices take less than it (no joined copy of the whole output).
    """
    out, pos, size = bytearray(size_hint), 0, len(raw)
    view, member = memoryview(raw), 0
    try:
        while True:  # one gzip member per turn
            d = zlib.decompressobj(wbits=31)
            at = member  # raw[:at] has gone into d
            while not d.eof:
                piece: bytes | memoryview = (
                    d.unconsumed_tail
                )  # what the last call left at the output cap
                if not piece and at < size:
                    piece = view[at : at + _GUNZIP_IN]
                    at += len(piece)
                part = d.decompress(piece, _GUNZIP_OUT)
                if not part and not piece:
                    break
                end = pos + len(part)
                if end > limit:
                    raise _too_big(end, limit, why, path, gz=True, at_least=True)
                out[pos:end] = part  # grows the buffer when the hint was short
                pos = end
            if not d.eof:
                raise TracekitError("truncated gzip file (it ends before its end marker)", path)
            member = at - len(d.unused_data)  # where the next member starts
            if raw.count(b"\0", member) == size - member:  # nothing but zero padding left
                break
    except zlib.error as exc:
        raise TracekitError(f"corrupt gzip data ({exc})", path) from None
    del out[pos:]
    return out


def read_bytes(path: Path) -> bytes | bytearray:
    """The file's JSON bytes (gunzipped when it starts with the gzip magic), refused before it
    is read when it is larger than :func:`max_trace_bytes` (for gzip: the size its trailer
    states, then the running output size). The bytes :func:`prefetch` read, when it did."""
    ahead = read_ahead.take(path)
    return ahead if ahead is not None else _read_now(path)


def _read_now(path: Path) -> bytes | bytearray:
    limit, why = max_trace_bytes()
    fd = guarded_read.open_regular(path)  # regular files only: a FIFO never blocks us
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            head = f.read(2)
            gz = head == b"\x1f\x8b"
            hint = 0
            if not gz and st.st_size > limit:
                raise _too_big(st.st_size, limit, why, path)
            if gz and st.st_size > limit:
                raise _too_big(st.st_size, limit, why, path, gz=True, at_least=True)
            if gz and st.st_size >= 18:
                f.seek(-4, os.SEEK_END)
                stated = int.from_bytes(f.read(4), "little")  # ISIZE: size mod 2**32
                # trust it only if deflate could reach it (ratio <= 1032): a cut file ends in noise
                if limit < stated <= _DEFLATE_MAX_RATIO * st.st_size:
                    raise _too_big(stated, limit, why, path, gz=True)
                # the output buffer's first size; only a likely ratio, as a hint may be noise
                hint = stated if stated <= min(limit, _HINT_MAX_RATIO * st.st_size) else 0
            f.seek(0)
            data = f.read()
        except OSError as exc:
            raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    if not data:
        raise TracekitError("empty file", path)
    if not gz:
        return data
    # one member of the size its trailer states (the usual trace) in one call; else in slices
    out = _gunzip_whole(data, hint) or _gunzip(data, limit, why, path, hint)
    if not out:
        raise TracekitError("empty file (gzip of nothing)", path)
    return out


HEAD_BYTES = 1 << 16


def read_head(path: Path, head_bytes: int = HEAD_BYTES) -> bytes | None:
    """The first ``head_bytes`` of a trace's JSON (gunzipped), or None when it cannot be read."""
    try:
        fd = guarded_read.open_regular(path)
    except TracekitError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            head = f.read(head_bytes)
            if head[:2] == b"\x1f\x8b":  # gzip: inflate until head_bytes of JSON are out
                inflate = zlib.decompressobj(wbits=31)
                out = inflate.decompress(head, head_bytes)
                while len(out) < head_bytes and not inflate.eof:
                    more = inflate.unconsumed_tail or f.read(head_bytes)
                    if not more:
                        break
                    out += inflate.decompress(more, head_bytes - len(out))
                head = out
    except (OSError, zlib.error):
        return None
    return head


def prefetch(paths: Sequence[Path], budget: int = read_ahead.PREFETCH_BYTES) -> threading.Thread:
    """Start reading PATHS ahead (tracekit.ingest.read_ahead) as :func:`read_bytes` reads them;
    not those that will be read in parts (tracekit.ingest.rank_memory), which it would hold."""
    from tracekit.ingest.rank_memory import should_stream

    try:
        paths = [p for p in paths if not should_stream(p)]
    except TracekitError:  # a bad $TRACEKIT_RANK_MEMORY: the read says so, nothing read ahead
        paths = []
    return read_ahead.start(paths, _read_now, budget)
