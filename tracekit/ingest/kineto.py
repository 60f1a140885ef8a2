"""Read Kineto (torch.profiler) Chrome-trace files into the events table (tracekit.events).

Why it looks like this: parse speed is a product feature (HTA needs ~0.8 CPU-s per 10 MB rank).
A file is gunzipped once into one buffer and read by one of two paths that give the same result:

- the C scanner (``_kscan.c``, built at install): one pass over the bytes straight into Arrow
  columns that polars takes over without copying, texts interned once each, no Python object
  per event, the GIL released (ranks scan in parallel threads); each event's ``args`` is kept
  as a byte range and only four keys are read from it. It declines anything it is not certain
  to read exactly like the msgspec path (tests/test_scanner.py holds it to that);
- msgspec (the fallback, and the judge of what a bad file is): typed Structs that declare only
  the fields used, ``args`` raw, one list comprehension per column.

Both hand over the X events' columns, which are classified with vectorised polars expressions
(the string rules once per distinct name). Only the few rows that are collective calls, thread
names or memory events decode their full args.

Rows: one per ``ph == "X"`` event. Events with a missing, negative or NaN ``dur`` or a
non-numeric ``ts`` are dropped (one warning line counts them), and so are events whose times
do not fit in int64 nanoseconds. ``start_ns = baseTimeNanoseconds + round(ts * 1000)`` (no base:
``round(ts * 1000)``), ``end_ns = start_ns + round(dur * 1000)``.

Column rules (beyond tracekit/events.py):

- ``pid``/``tid`` as text (real traces mix ints and strings such as ``"Spans"``).
- ``thread_name``: the ``args.name`` of ``ph:"M", name:"thread_name"`` events, full text
  (``"thread 5835 (pt_gloo_runloop)"``). Kineto often emits two different names for one thread
  (torch 2.13 gloo runloop threads appear both as ``(python)`` and ``(pt_gloo_runloop)``, in
  either order), so all distinct names of a (pid, tid) are kept, joined by ``" | "`` in the
  order seen: match with ``str.contains``, never equality. Older traces name gloo runloop
  threads ``pt_main_thread`` (HTA's cpu_only): the reliable test for a runloop thread is "it
  carries ``gloo:*`` annotations".
- ``device`` = "gpu" for cat in {kernel, gpu_memcpy, gpu_memset, gpu_user_annotation,
  cuda_sync}; ``stream`` = ``args.stream`` there (else the numeric tid, which Kineto sets to the
  stream), null on CPU rows.
- ``kind``: see events.py. ``cpu_op`` rows named ``c10d::*``, ``_c10d_functional::*``,
  ``record_param_comms``, ``nccl:*`` or ``gloo:*`` are communication (calls and their waits);
  ``user_annotation`` rows are communication only when named ``gloo:*`` (the gloo transfer
  spans); ``nccl:*`` annotations on GPU traces stay "annotation" (the kernels are the transfer).
- ``correlation`` = ``args.correlation``; ``external_id`` = ``args["External id"]``.

Collective columns (``op``, ``bytes``, ``dtype``, ``group``, ``group_size``, ``group_ranks``,
``peer``), filled from what the row itself carries:

- ``record_param_comms`` args (GPU traces; also copied onto NCCL kernels by recent torch):
  op from ``Collective name``; bytes = ``Out msg nelems`` (all_gather) or ``In msg nelems``
  (everything else) x element size of ``dtype``; group = ``Process Group Name`` (the id used in
  ``distributedInfo.pg_config``), group_size = ``Group size``, group_ranks = ``Process Group
  Ranks`` (text), peer = ``Dst Rank`` (send) / ``Src Rank`` (recv) when present.
- ``c10d::<op>`` cpu_ops: op from the name; S from the argument named in
  ``collectives.C10D_ARG`` (all_gather: the output; reduce_scatter: the input).
  ``TensorList`` arguments record shapes but no dtype, so ``c10d::allreduce_``, ``broadcast_``,
  ``reduce_``, ``send``, ``recv_``, ``allgather_``... have bytes null; the matching ``gloo:*``
  span has them. peer of ``c10d::send``/``c10d::recv_`` = ``Concrete Inputs[2]``: the peer's
  rank *within the op's process group* (equal to the global rank in the default group).
- ``gloo:<op>`` / ``nccl:<op>`` record functions: op from the name (gloo's real op: a
  reduce_scatter shows as ``gloo:all_reduce`` over the full input, so these rows say what gloo
  really sends), bytes = sum over the recorded input tensors. These record the *per-rank
  input*; for all_gather S = input x group size (same for ``c10d::allgather_`` and the output
  list of ``c10d::reduce_scatter_``).
- **Group size on CPU traces**: the calls do not say which process group they use. When every
  group in ``distributedInfo.pg_config`` has the same ``pg_size`` (always true with one group),
  that size is the group size: it fills ``group_size`` of c10d/gloo/nccl rows and scales the
  all_gather bytes. Otherwise those bytes are left **null** (with a warning) rather than
  giving the per-rank input under a column that means S: a sum over ``bytes`` stays correct or
  visibly incomplete, never silently n times too small. (pg_config is snapshotted at profiler
  start; a group created later is not in it.) ``group``/``group_ranks`` stay null on CPU rows.
- NCCL kernels without args: op from the kernel name (``AllReduce``, ``AllGather``,
  ``ReduceScatter``, ``Broadcast``, ``Reduce``); **``SendRecv`` and ``Generic`` give op null**:
  NCCL runs send, recv and all_to_all alike as SendRecv (trace_filter's SendRecv kernels are
  all_to_all), so naming them "send" would be wrong more often than right. kind stays
  "communication"; a later stage can take the op from the launching CPU call via correlation.
- ``_c10d_functional::*`` cpu_ops (DTensor / functional collectives) are communication with op
  null: each wraps a ``c10d::`` op that carries the op, so filling both would count it twice.
- barrier: bytes 0 (no payload). Ops outside the list of docs/labels.md (gather, scatter, coalesced
  markers, ``wait``) give op null. ``dtype`` is canonical torch naming (float32, bfloat16,
  int64, ...); an unknown spelling is kept as given, with bytes null.
- The same collective shows on several rows (CPU call, backend span, record_param_comms,
  kernel); count one family. GPU: kernels (device gpu, kind communication). CPU/gloo: the
  ``gloo:*`` spans for time, the ``c10d::*`` calls for the nominal op and peer.

Ranks: ``distributedInfo.rank``, else the ``rank`` argument, else ``rank<N>``/``rank-<N>``/
``rank_<N>`` in the file name (runfolder.rank_from_filename; never other digits), else 0 with
a warning. :func:`read_traces` refuses a defaulted rank when given several files; several
files of one rank go to tracekit.ingest.foreign (latest profiling cycle, or an error). It
parses files in threads of this process, one per idle CPU, or, with three idle CPUs or more
and over 16 MiB of trace, in spawned worker processes (fork is unsafe once polars' thread pool
runs) whose frames come back as Arrow IPC bytes, metadata as JSON.
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import os
import stat
import sys
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TracekitError
from tracekit.events import EVENT_SCHEMA, empty_events
from tracekit.ingest import collectives as coll
from tracekit.ingest import devices
from tracekit.runfolder import rank_from_filename

try:
    from tracekit.ingest import _kscan
except ImportError:  # built without a C compiler: the msgspec path reads everything
    _kscan = None

GPU_CATS = devices.DEVICE_CATS  # canonical names (tracekit.ingest.devices)
COMM_KERNEL = r"(?i)^(void )?(nccl|rccl)|ncclDevKernel|ncclKernel"
COMM_CPU_OP = r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|gloo:)|^record_param_comms$"
_TIME_LIMIT = float(2**62)  # |ns| bound: int64 arithmetic on start/end can never overflow
_RANK_LIMIT = 2**31
NO_RANK_WARNING = "no rank in distributedInfo or file name; taken as rank 0"
_POOL_MIN_BYTES = 16 * 2**20  # below this much trace on disk, worker start-up costs more
_POOL_MIN_CPUS = 3  # two workers bought 13 % of wall time for 65 % more memory


@dataclass(frozen=True)
class TraceInfo:
    """What one trace file says about itself, and what ingest had to drop or guess."""

    path: Path
    rank: int
    rank_source: str  # "distributedInfo" | "argument" | "filename" | "default"
    world_size: int | None
    backend: str | None  # "gloo" | "nccl" | ...
    host_name: str | None
    base_ns: int | None  # baseTimeNanoseconds
    pg_config: tuple[dict, ...]  # distributedInfo.pg_config as given
    device_properties: tuple[dict, ...]
    has_gpu: bool  # any device work: kernel / gpu_memcpy / gpu_memset / mtia_ccp_events events
    profiler_steps: int  # number of ProfilerStep#N annotations
    warnings: tuple[str, ...]  # one line each: what is missing or was dropped
    # device ('cpu', 'cuda:0', ...) -> max 'Total Allocated' of the profiler's [memory] events
    memory_peak_bytes: dict[str, int] = field(default_factory=dict)


# --- decoding ------------------------------------------------------------------------------

_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` keys ingest reads on the rows that need more than :class:`_Common`
    (collective calls, thread names, memory events); loose types because real traces vary."""

    name: Any = None  # thread_name metadata
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")  # [memory] events
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class _Common(msgspec.Struct, gc=False):
    """The ``args`` keys every X event may need (the rest are read from the few rows that use
    them: collective calls, thread names, memory events)."""

    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    coll_name: Any = msgspec.field(default=None, name="Collective name")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    # kept as raw JSON and decoded per use: a typed decode of every event's args was a third of
    # the decode time and most of its objects (measured: 195 -> 105 ms for a 30 MB trace)
    args: msgspec.Raw = _NO_RAW


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]  # noqa: N815 - the file's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None


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


_GUNZIP_CHUNK = 2 << 20  # under the mmap threshold below: chunks reuse the heap
_MMAP_THRESHOLD = 4 << 20


@functools.lru_cache(maxsize=1)
def _pin_mmap_threshold() -> None:
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


def _gunzip(raw: bytes, limit: int, why: str, path: Path, size_hint: int = 0) -> bytearray:
    """Decompress every gzip member into one buffer, never producing more than ``limit`` bytes.

    Output comes in chunks of 2 MB copied into a buffer sized by ``size_hint`` (the trailer's
    stated size): zlib's own growing block list, joined at the end, touched every page twice
    (4x the page faults of a 30 MB rank), and much smaller chunks would copy the unconsumed
    input many times over.
    """
    out, pos, buf = bytearray(size_hint), 0, raw
    try:
        while True:  # one gzip member per turn
            d = zlib.decompressobj(wbits=31)
            while not d.eof:
                part = d.decompress(buf, _GUNZIP_CHUNK)
                buf = d.unconsumed_tail
                if not part and not buf:
                    break
                end = pos + len(part)
                if end > limit:
                    raise _too_big(end, limit, why, path, gz=True, at_least=True)
                out[pos:end] = part  # grows the buffer when the hint was short
                pos = end
            if not d.eof:
                raise TracekitError("truncated gzip file (it ends before its end marker)", path)
            buf = d.unused_data
            if not buf.strip(b"\0"):
                break
    except zlib.error as exc:
        raise TracekitError(f"corrupt gzip data ({exc})", path) from None
    del out[pos:]
    return out


def _read_bytes(path: Path) -> bytes | bytearray:
    """The file's JSON bytes (gunzipped when it starts with the gzip magic), refused before it
    is read when it is larger than :func:`max_trace_bytes` (for gzip: the size its trailer
    states, then the running output size)."""
    limit, why = max_trace_bytes()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us
    except OSError as exc:
        raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise TracekitError("not a regular file", path)
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
    data = _gunzip(data, limit, why, path, hint)
    if not data:
        raise TracekitError("empty file (gzip of nothing)", path)
    return data


def _decode(data: bytes, path: Path) -> _Trace:
    """Typed decode; on failure retry via the stdlib (NaN, Infinity, 1e400) before giving up."""
    decoder = msgspec.json.Decoder(_Trace, strict=False)
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        first = exc
    try:  # json.loads accepts NaN/Infinity; msgspec re-encodes them as null ("missing")
        return decoder.decode(msgspec.json.encode(json.loads(data)))
    except Exception:  # noqa: BLE001 - any failure here means the first error stands
        pass
    if isinstance(first, RecursionError):
        raise TracekitError("not a Kineto trace (JSON nested too deeply)", path) from None
    if isinstance(first, msgspec.ValidationError):
        raise TracekitError(f"not a Kineto trace ({first})", path) from None
    raise TracekitError(f"not valid JSON ({first})", path) from None


# --- metadata ------------------------------------------------------------------------------


def _as_int(value: Any, low: int, high: int) -> int | None:
    """An int in [low, high) or None (bools, floats, text and huge values are not ranks)."""
    return value if type(value) is int and low <= value < high else None


def _dicts(value: Any) -> tuple[dict, ...] | None:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return tuple(value)
    return None


def _meta(trace: _Trace, warnings: list[str]) -> dict[str, Any]:
    """distributedInfo, host and clock base, each checked; oddities become warnings."""
    dist = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    if trace.distributedInfo is not None and not dist:
        warnings.append("distributedInfo is not an object; ignored")
    raw_rank = dist.get("rank")
    rank = _as_int(raw_rank, 0, _RANK_LIMIT)
    if raw_rank is not None and rank is None:
        warnings.append(f"distributedInfo.rank {str(raw_rank)[:40]!r} is not a rank; ignored")
    pg_config = _dicts(dist.get("pg_config"))
    if pg_config is None:
        warnings.append("distributedInfo.pg_config is not a list of objects; ignored")
        pg_config = ()
    devices = _dicts(trace.deviceProperties)
    if devices is None:
        warnings.append("deviceProperties is not a list of objects; ignored")
        devices = ()
    base = trace.baseTimeNanoseconds
    if isinstance(base, str) and base.strip().isdigit():  # MTIA traces write it as text
        base = int(base)
    base_ns = _as_int(base, -(2**62), 2**62)
    if base is not None and base_ns is None:
        warnings.append(
            f"baseTimeNanoseconds {str(base)[:40]!r} is not usable; times taken as given"
        )
    backend, host = dist.get("backend"), trace.host_name
    return {
        "rank": rank,
        "world_size": _as_int(dist.get("world_size"), 1, _RANK_LIMIT + 1),
        "backend": backend if isinstance(backend, str) else None,
        "host_name": host if isinstance(host, str) else None,
        "base_ns": base_ns,
        "pg_config": pg_config,
        "device_properties": devices,
    }


def uniform_group_size(pg_config: Sequence[dict]) -> int | None:
    """The group size every listed process group shares, or None (none listed, or several)."""
    sizes = {g.get("pg_size") for g in pg_config}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size if type(size) is int and size > 0 else None


def _choose_rank(
    path: Path, meta_rank: int | None, rank: int | None, warnings: list[str]
) -> tuple[int, str]:
    from_name = _as_int(rank_from_filename(path.name), 0, _RANK_LIMIT)
    if rank is not None and _as_int(rank, 0, _RANK_LIMIT) is None:
        raise TracekitError(f"rank {rank!r} is not a rank (0 <= rank < 2**31)", path)
    if meta_rank is not None:
        if from_name is not None and from_name != meta_rank:
            warnings.append(
                f"file name says rank {from_name} but distributedInfo says "
                f"{meta_rank}; using {meta_rank}"
            )
        return meta_rank, "distributedInfo"
    if rank is not None:
        return rank, "argument"
    if from_name is not None:
        return from_name, "filename"
    warnings.append(NO_RANK_WARNING)
    return 0, "default"


# --- args, decoded where used ---------------------------------------------------------------

_NO_COMMON, _NO_ARGS = _Common(), _Args()
_COMMON_DECODER = msgspec.json.Decoder(_Common, strict=False)
_ARGS_DECODER = msgspec.json.Decoder(_Args, strict=False)


def _args_of(decoder: msgspec.json.Decoder, raw: msgspec.Raw, path: Path, empty: Any) -> Any:
    """One event's args (absent or null: ``empty``); anything else that is not an object is an
    error naming the file, as a typed decode of the whole file would have said."""
    if not raw:
        return empty
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        if bytes(raw).strip() == b"null":
            return empty
        raise TracekitError(f"not a Kineto trace (an event's args: {exc})", path) from None
    except msgspec.DecodeError as exc:
        try:  # NaN / Infinity / 1e400, which json.loads reads
            return decoder.decode(msgspec.json.encode(json.loads(bytes(raw))))
        except Exception:  # noqa: BLE001 - the first error stands
            raise TracekitError(f"not valid JSON ({exc})", path) from None
    except RecursionError:
        raise TracekitError("not a Kineto trace (JSON nested too deeply)", path) from None


def _common_args(xs: list[_Event], path: Path) -> list[_Common]:
    """``_Common`` of every X event: one decode call each, the careful path only if one fails."""
    decode = _COMMON_DECODER.decode
    try:
        return [decode(e.args) if e.args else _NO_COMMON for e in xs]
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return [_args_of(_COMMON_DECODER, e.args, path, _NO_COMMON) for e in xs]


def _full_args(raw: msgspec.Raw, path: Path) -> _Args:
    return _args_of(_ARGS_DECODER, raw, path, _NO_ARGS)


class _FullArgs:
    """All read ``args`` keys of X event i (``_Args``), decoded on first use."""

    def __init__(self, raw_args: Callable[[int], bytes], path: Path) -> None:
        self.raw_args, self.path, self.done = raw_args, path, {}

    def __getitem__(self, i: int) -> _Args:
        if i not in self.done:
            self.done[i] = _full_args(self.raw_args(i), self.path)
        return self.done[i]


# --- columns -------------------------------------------------------------------------------


def _keep(values: list, dtype: pl.DataType) -> list:
    """Only the values a column of ``dtype`` can hold (bools, lists, dicts become None)."""
    if dtype == pl.Utf8:
        return [v if v.__class__ is str else None for v in values]
    if dtype == pl.Float64:
        return [v if v.__class__ is float or v.__class__ is int else None for v in values]
    return [v if v.__class__ is int else None for v in values]


def _series(name: str, values: list, dtype: pl.DataType) -> pl.Series:
    """A typed column from loosely typed values; what does not fit becomes null.

    The strict constructor is the fast path for well-formed traces; anything odd (text where
    a number belongs, nested lists, ints beyond 64 bits) takes the filtered path.
    """
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except Exception:  # noqa: BLE001 - polars raises several types here; the fallback is total
        return pl.Series(name, _keep(values, dtype), dtype=dtype, strict=False)


def _text_series(name: str, values: list) -> pl.Series:
    """pid/tid as text: all-int ids are converted by polars (the usual case, 2x faster than
    per-value Python); mixed ones (``"Spans"``) take few distinct values, each converted once."""
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True).cast(pl.Utf8)
    except Exception:  # noqa: BLE001 - text, floats, huge or odd values: the general path
        pass
    try:
        text = {v: v if v.__class__ is str else None if v is None else str(v) for v in set(values)}
        return pl.Series(name, [text[v] for v in values], dtype=pl.Utf8)
    except (TypeError, KeyError):  # unhashable (a list where an id belongs) or NaN
        kept = [v if v.__class__ in (str, int, float) else None for v in values]
        return pl.Series(
            name, [v if v is None or v.__class__ is str else str(v) for v in kept], dtype=pl.Utf8
        )


def _base_frame(xs: list[_Event], args: list[_Common]) -> pl.DataFrame:
    """Raw columns of the X events, one comprehension each, in file order (column ``i``)."""
    return pl.DataFrame(
        [
            pl.Series("i", range(len(xs)), dtype=pl.Int64),
            _series("cat", [e.cat for e in xs], pl.Utf8),
            _series("name", [e.name for e in xs], pl.Utf8),
            _text_series("pid", [e.pid for e in xs]),
            _text_series("tid", [e.tid for e in xs]),
            _series("ts", [e.ts for e in xs], pl.Float64),
            _series("dur", [e.dur for e in xs], pl.Float64),
            _series("stream_arg", [a.stream for a in args], pl.Int64),
            _series("correlation", [a.correlation for a in args], pl.Int64),
            _series("external_id", [a.external_id for a in args], pl.Int64),
            _series("coll_name", [a.coll_name for a in args], pl.Utf8),
        ]
    )


def _params_frame(idx: list[int], args: _FullArgs) -> pl.DataFrame:
    """record_param_comms-style args of the rows that carry a ``Collective name``."""
    sub = [args[i] for i in idx]
    return pl.DataFrame(
        [
            pl.Series("i", idx, dtype=pl.Int64),
            _series("in_nelems", [a.in_nelems for a in sub], pl.Int64),
            _series("out_nelems", [a.out_nelems for a in sub], pl.Int64),
            _series("p_dtype", [a.dtype for a in sub], pl.Utf8),
            _series("p_group_size", [a.group_size for a in sub], pl.Int32),
            _series("p_group", [a.pg_name for a in sub], pl.Utf8),
            _series("p_group_ranks", [a.pg_ranks for a in sub], pl.Utf8),
            _series("src_rank", [a.src_rank for a in sub], pl.Int32),
            _series("dst_rank", [a.dst_rank for a in sub], pl.Int32),
        ]
    )


def _calls_frame(rows: list[tuple[int, int, str | None]], args: _FullArgs) -> pl.DataFrame:
    """Bytes/dtype/peer of c10d and backend calls, read from their nested Input Dims."""
    sized = [coll.call_bytes(args[i].input_dims, args[i].input_type, k) for i, k, _ in rows]
    peers = [
        coll.concrete_int(args[i].concrete, coll.P2P_PEER_ARG)
        if op in ("send", "recv") and k >= 0
        else None
        for i, k, op in rows
    ]
    return pl.DataFrame(
        [
            pl.Series("i", [r[0] for r in rows], dtype=pl.Int64),
            _series("c_bytes", [s[0] for s in sized], pl.Int64),
            _series("c_dtype", [s[1] for s in sized], pl.Utf8),
            _series("c_peer", peers, pl.Int32),
        ]
    )


def _thread_names(threads: pl.DataFrame, raws: list[bytes], path: Path) -> pl.DataFrame:
    """(pid, tid) -> every distinct thread_name metadata text, joined by " | " in file order.

    ``threads``: pid, tid (text) of the ``thread_name`` metadata events; ``raws``: their args.
    """
    frame = threads.with_columns(
        _series("thread_name", [_full_args(r, path).name for r in raws], pl.Utf8)
    )
    return (
        frame.drop_nulls()
        .group_by("pid", "tid", maintain_order=True)
        .agg(pl.col("thread_name").unique(maintain_order=True).str.join(" | "))
    )


def _kind_expr() -> pl.Expr:
    cat, name = pl.col("cat"), pl.col("name")
    return (
        pl.when(cat == "kernel")
        .then(
            pl.when(name.str.contains(COMM_KERNEL))
            .then(pl.lit("communication"))
            .otherwise(pl.lit("compute"))
        )
        .when(cat.is_in(["gpu_memcpy", "gpu_memset"]))
        .then(pl.lit("memory"))
        .when(cat == "mtia_ccp_events")
        .then(devices.mtia_kind())
        .when(cat == "cuda_sync")
        .then(pl.lit("sync"))
        .when(cat == "cpu_op")
        .then(
            pl.when(name.str.contains(COMM_CPU_OP))
            .then(pl.lit("communication"))
            .otherwise(pl.lit("compute"))
        )
        .when(cat == "user_annotation")
        .then(
            pl.when(name.str.starts_with("gloo:"))
            .then(pl.lit("communication"))
            .otherwise(pl.lit("annotation"))
        )
        .when(cat == "gpu_user_annotation")
        .then(pl.lit("annotation"))
        .when(cat.is_in(devices.RUNTIME_CATS))
        .then(pl.lit("runtime"))
        .otherwise(pl.lit("other"))
    )


@functools.lru_cache(maxsize=1)
def _class_exprs() -> tuple[list[pl.Expr], ...]:
    """Built once: making these expressions costs more Python time than running them on a
    rank's few hundred distinct names."""
    return (
        [_kind_expr().alias("kind")],
        [coll.family_expr().alias("family")],
        [coll.op_expr().alias("op")],
        coll.arg_rule_exprs(),
    )


def _classes(frame: pl.DataFrame) -> pl.DataFrame:
    """kind, and the collective family / op / arg rules, of each distinct (cat, name,
    coll_name): the string rules (regexes) run once per distinct name, not once per event."""
    kind, family, op, rules = _class_exprs()
    return (
        frame.lazy()
        .select("cat", "name", "coll_name")
        .unique()
        .with_columns(kind)
        .with_columns(family)
        .with_columns(op)
        .with_columns(rules)
        .collect()
    )


def _drop_bad_times(frame: pl.DataFrame, base_ns: int | None, warnings: list[str]) -> pl.DataFrame:
    """Keep rows whose ts/dur are finite numbers, dur >= 0, and whose ns fit in int64."""
    ts, dur = pl.col("ts"), pl.col("dur")
    numeric = (ts.is_finite() & dur.is_finite() & (dur >= 0)).fill_null(False)
    fits = ((ts * 1000 + (base_ns or 0)).abs() + dur * 1000 < _TIME_LIMIT).fill_null(False)
    counts = frame.select(bad=(~numeric).sum(), big=(numeric & ~fits).sum()).row(0)
    if counts[0]:
        warnings.append(
            f"dropped {counts[0]} events with missing/negative/NaN durations "
            "or non-numeric timestamps"
        )
    if counts[1]:
        warnings.append(f"dropped {counts[1]} events whose times do not fit in 64-bit nanoseconds")
    return frame.filter(numeric & fits) if any(counts) else frame


def _time_exprs(base_ns: int | None) -> list[pl.Expr]:
    """Exact integer ns: whole microseconds x 1000 plus the rounded fraction."""
    ts, dur = pl.col("ts"), pl.col("dur")
    whole = ts.floor()
    start = (
        pl.lit(base_ns or 0, dtype=pl.Int64)
        + whole.cast(pl.Int64) * 1000
        + ((ts - whole) * 1000).round().cast(pl.Int64)
    )
    return [start.alias("start_ns"), (start + (dur * 1000).round().cast(pl.Int64)).alias("end_ns")]


def _collective_columns(
    calls: pl.DataFrame, args: _FullArgs, group_size: int | None, warnings: list[str]
) -> pl.DataFrame:
    """``i`` plus op, bytes, dtype, group, group_size, group_ranks, peer of the collective rows.

    ``calls``: the rows that have a family, with :func:`_classes`' columns; everything here
    runs on them alone (see the module docstring for the rules).
    """
    params_idx = calls.filter(pl.col("family") == "params")["i"].to_list()
    params = (
        _params_frame(params_idx, args)
        .join(calls.select("i", "op"), on="i", how="left")
        .with_columns(coll.params_exprs())
        .drop("op")
    )
    sized_rows = (
        calls.filter(
            pl.col("op").is_not_null()
            & pl.col("arg_index").is_not_null()
            & (pl.col("op") != "barrier")
        )
        .select("i", "arg_index", "op")
        .rows()
    )
    calls = calls.join(params, on="i", how="left").join(
        _calls_frame(sized_rows, args), on="i", how="left"
    )
    unknown_n = calls.filter(pl.col("scale_n") & pl.col("c_bytes").is_not_null()).height
    if unknown_n and not group_size:
        warnings.append(
            f"bytes left null for {unknown_n} all_gather/reduce_scatter calls: the "
            "group size is unknown (pg_config lists groups of several sizes, or none)"
        )
    is_call = pl.col("family").is_in(["c10d", "backend"]) & pl.col("op").is_not_null()
    return calls.select(
        "i",
        "op",
        pl.when(pl.col("op") == "barrier")
        .then(pl.lit(0, dtype=pl.Int64))
        .when(pl.col("family") == "params")
        .then(pl.col("p_bytes"))
        .when(pl.col("scale_n"))
        .then(coll.safe_product(pl.col("c_bytes"), pl.lit(group_size, dtype=pl.Int64)))
        .otherwise(pl.col("c_bytes"))
        .alias("bytes"),
        pl.coalesce("p_dtype_c", "c_dtype").alias("dtype"),
        pl.col("p_group").alias("group"),
        pl.when(pl.col("family") == "params")
        .then(pl.col("p_group_size"))
        .when(is_call)
        .then(pl.lit(group_size, dtype=pl.Int32))
        .alias("group_size"),
        pl.col("p_group_ranks").alias("group_ranks"),
        pl.coalesce("p_peer", "c_peer").alias("peer"),
    )


# --- the decoded trace: two paths, one result --------------------------------------------


@dataclass
class _Decoded:
    """One trace as the rest of ingest reads it, from either decoding path."""

    top: _Trace  # distributedInfo, deviceProperties, ... (no events)
    xframe: pl.DataFrame  # the X events' raw columns (_base_frame's), file order
    raw_args: Callable[[int], bytes]  # X event i -> its args JSON (b"" when none)
    threads: pl.DataFrame  # pid, tid (text) of thread_name metadata events
    thread_args: list[bytes]  # ... and their args
    memory_args: list[bytes]  # args of the [memory] instant events


def _decoded_msgspec(data: bytes, path: Path) -> _Decoded:
    """The general path: msgspec Structs, then one comprehension per column. Reads every
    trace, and words every error."""
    trace = _decode(data, path)
    events = trace.traceEvents
    xs = [e for e in events if e.ph == "X"]
    meta = [e for e in events if e.ph == "M" and e.name == "thread_name" and e.args]
    threads = pl.DataFrame(
        [_text_series("pid", [e.pid for e in meta]), _text_series("tid", [e.tid for e in meta])]
    )
    memory = [e.args for e in events if e.ph == "i" and e.name == "[memory]" and e.args]
    trace.traceEvents = []  # the frames hold what is needed; free the Structs early
    return _Decoded(
        trace,
        _base_frame(xs, _common_args(xs, path)),
        lambda i: xs[i].args,
        threads,
        [e.args for e in meta],
        memory,
    )


class _ArrowColumns:
    """The scanner's (arrow_schema, arrow_array) capsules, in the form polars imports."""

    def __init__(self, capsules: tuple) -> None:
        self.capsules = capsules

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple:
        return self.capsules


def _decoded_fast(data: bytes, path: Path) -> _Decoded | None:
    """The C scanner's path (tracekit/ingest/_kscan.c): columns without per-event Python
    objects. None when the scanner is not built or declines the file (anything unusual:
    the msgspec path then reads it, or says what is wrong)."""
    if _kscan is None:
        return None
    scanned = _kscan.scan(data)
    if scanned is None:
        return None
    _, strings, capsules, spans = scanned
    try:
        top = _Trace([], **{k: msgspec.json.decode(data[a:b]) for k, (a, b) in spans.items()})
    except (msgspec.DecodeError, RecursionError):
        return None
    text = pl.Series("text", strings, dtype=pl.Utf8)

    def codes(column: str, *values: str) -> pl.Expr:  # several codes may spell one text
        return pl.col(column).is_in([k for k, t in enumerate(strings) if t in values])

    def texts(*columns: str) -> list[pl.Expr]:
        return [pl.lit(text).gather(pl.col(c)).alias(c) for c in columns]

    events = pl.DataFrame(_ArrowColumns(capsules))
    xs = events.filter(codes("ph", "X"))
    xframe = xs.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("i"),
        *texts("cat", "name", "pid", "tid"),
        "ts",
        "dur",
        "stream_arg",
        "correlation",
        "external_id",
        *texts("coll_name"),
    )
    spans_of_args = xs.select("args_start", "args_end")  # looked up for the few rows that need them
    with_args = pl.col("args_end") > pl.col("args_start")
    meta = events.filter(codes("ph", "M") & codes("name", "thread_name") & with_args)
    memory = events.filter(codes("ph", "i") & codes("name", "[memory]") & with_args)
    return _Decoded(
        top,
        xframe,
        lambda i: data[slice(*spans_of_args.row(i))],
        meta.select(texts("pid", "tid")),
        [data[a:b] for a, b in meta.select("args_start", "args_end").iter_rows()],
        [data[a:b] for a, b in memory.select("args_start", "args_end").iter_rows()],
    )


def _decode_trace(data: bytes, path: Path) -> _Decoded:
    return _decoded_fast(data, path) or _decoded_msgspec(data, path)


def _events_frame(
    decoded: _Decoded,
    rank: int,
    base_ns: int | None,
    group_size: int | None,
    warnings: list[str],
    path: Path,
) -> pl.DataFrame:
    """The events table of one decoded trace, exactly EVENT_SCHEMA."""
    if not decoded.xframe.height:
        warnings.append("no complete (ph 'X') events")
        return empty_events()
    frame = devices.canonical_cats(_drop_bad_times(decoded.xframe, base_ns, warnings))
    is_gpu = pl.col("cat").is_in(GPU_CATS)
    frame = frame.join(
        _classes(frame),
        on=["cat", "name", "coll_name"],
        how="left",
        maintain_order="left",
        nulls_equal=True,
    ).with_columns(
        *_time_exprs(base_ns),
        pl.when(is_gpu).then(pl.lit("gpu")).otherwise(pl.lit("cpu")).alias("device"),
        pl.when(is_gpu)
        .then(pl.coalesce("stream_arg", pl.col("tid").cast(pl.Int64, strict=False)))
        .alias("stream"),
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        # an Event Sync (stream -1) is the host waiting on an event: it occupies no stream
        pl.when((pl.col("cat") == "cuda_sync") & (pl.col("stream_arg") == -1))
        .then(pl.lit("other"))
        .otherwise(pl.col("kind"))
        .alias("kind"),
    )
    calls = frame.filter(pl.col("family").is_not_null()).select(
        "i", "cat", "name", "kind", "coll_name", "family", "op", "arg_index", "scale_n"
    )
    collective = _collective_columns(calls, _FullArgs(decoded.raw_args, path), group_size, warnings)
    threads = _thread_names(decoded.threads, decoded.thread_args, path)
    frame = frame.join(threads, on=["pid", "tid"], how="left", maintain_order="left").join(
        collective, on="i", how="left", maintain_order="left"
    )
    return frame.select([pl.col(c).cast(t) for c, t in EVENT_SCHEMA.items()])


#: c10::DeviceType numbers of the [memory] events' "Device Type" -> torch device names
_DEVICE_TYPES = {
    0: "cpu",
    1: "cuda",
    2: "mkldnn",
    3: "opengl",
    4: "opencl",
    5: "ideep",
    6: "hip",
    7: "fpga",
    8: "maia",
    9: "xla",
    10: "vulkan",
    11: "metal",
    12: "xpu",
    13: "mps",
    14: "meta",
    15: "hpu",
    16: "ve",
    17: "lazy",
    18: "ipu",
    19: "mtia",
    20: "privateuseone",
}


def memory_peaks(raws: list[bytes], path: Path) -> dict[str, int]:
    """Device -> max ``Total Allocated`` over the ``[memory]`` instant events (``ph: "i"``).

    Keys are torch device names: "cpu", "cuda:0", ... On CPU the profiler's reporter counts only
    tensors allocated while it records, so the CPU peak is the peak of memory allocated during
    the profiled window (tensors that existed before it are not in it); on GPU it is the caching
    allocator's total allocated, everything included.
    """
    mem = [_full_args(r, path) for r in raws]
    if not mem:
        return {}
    frame = pl.DataFrame(
        [
            _series("type", [a.device_type for a in mem], pl.Int64),
            _series("id", [a.device_id for a in mem], pl.Int64),
            _series("total", [a.total_allocated for a in mem], pl.Int64),
        ]
    ).drop_nulls()
    name = pl.col("type").replace_strict(_DEVICE_TYPES, default=None, return_dtype=pl.Utf8)
    name = pl.coalesce(name, pl.lit("device") + pl.col("type").cast(pl.Utf8))
    peaks = (
        frame.group_by("type", "id")
        .agg(pl.col("total").max())
        .with_columns(
            pl.when((pl.col("type") == 0) | (pl.col("id") < 0))
            .then(name)
            .otherwise(pl.concat_str([name, pl.col("id").cast(pl.Utf8)], separator=":"))
            .alias("device")
        )
    )
    return {d: int(t) for d, t in peaks.select("device", "total").iter_rows()}


def _count_steps(frame: pl.DataFrame) -> int:
    steps = frame.filter(pl.col("name").str.starts_with("ProfilerStep#")).filter(
        (pl.col("device") == "cpu") & pl.col("name").str.contains(r"^ProfilerStep#\d+$")
    )
    return steps["name"].n_unique()


# --- public API ----------------------------------------------------------------------------


def read_trace(path: Path, rank: int | None = None) -> tuple[TraceInfo, pl.DataFrame]:
    """Read one Kineto trace (``.json`` or gzip) into (metadata, events with EVENT_SCHEMA).

    ``rank`` is used only when the trace has no ``distributedInfo.rank``; a file name's
    ``rank<N>`` comes next, then rank 0 with a warning. Any problem with the file is a
    TracekitError naming it.
    """
    path = Path(path)
    return _read_decoded(_decode_trace(_read_bytes(path), path), path, rank)


def _read_decoded(
    decoded: _Decoded, path: Path, rank: int | None
) -> tuple[TraceInfo, pl.DataFrame]:
    warnings: list[str] = []
    meta = _meta(decoded.top, warnings)
    chosen, source = _choose_rank(path, meta.pop("rank"), rank, warnings)
    group_size = uniform_group_size(meta["pg_config"])
    frame = _events_frame(decoded, chosen, meta["base_ns"], group_size, warnings, path)
    warnings.extend(devices.device_warnings(frame, meta["device_properties"]))
    info = TraceInfo(
        path=path,
        rank=chosen,
        rank_source=source,
        **meta,
        has_gpu=bool(frame["cat"].is_in(devices.WORK_CATS).any()),
        profiler_steps=_count_steps(frame),
        warnings=tuple(warnings),
        memory_peak_bytes=memory_peaks(decoded.memory_args, path),
    )
    return info, frame


_HEAD_BYTES = 1 << 16
_DIST_KEY = b'"distributedInfo"'


def _object_at(text: bytes, start: int) -> bytes | None:
    """The JSON object that starts at ``text[start]`` (a "{"), or None if it is cut off."""
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:  # backslash
                esc = True
            elif c == 0x22:  # quote
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c == 0x7B:  # {
            depth += 1
        elif c == 0x7D:  # }
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def read_head(path: Path, head_bytes: int = _HEAD_BYTES) -> bytes | None:
    """The first ``head_bytes`` of a trace's JSON (gunzipped), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
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


def peek_distributed_info(path: Path, head_bytes: int = _HEAD_BYTES) -> dict | None:
    """``distributedInfo`` read from the first 64 KB of a trace, without parsing its events.

    Kineto writes it before ``traceEvents``, so selecting ranks by it (``--ranks``,
    ``--sample``) costs a few milliseconds per file, not a parse. None when the head does not
    hold it (or the file cannot be read: reading it later reports that properly).
    """
    head = read_head(path, head_bytes)
    if head is None:
        return None
    at = head.find(_DIST_KEY)
    if at < 0:
        return None
    brace = head.find(b"{", at + len(_DIST_KEY))
    if brace < 0 or head[at + len(_DIST_KEY) : brace].strip(b" \t\r\n:") != b"":
        return None
    obj = _object_at(head, brace)
    try:
        info = msgspec.json.decode(obj) if obj else None
    except msgspec.DecodeError:
        return None
    return info if isinstance(info, dict) else None


def peek_rank(path: Path) -> int | None:
    """The rank a trace file declares in its head (``distributedInfo.rank``), else None."""
    info = peek_distributed_info(path)
    return _as_int(info.get("rank"), 0, _RANK_LIMIT) if info else None


def encode_info(info: TraceInfo) -> bytes:
    """TraceInfo as JSON bytes (worker results, cache entries)."""
    return msgspec.json.encode(info, enc_hook=str)


def decode_info(data: bytes) -> TraceInfo:
    return msgspec.json.decode(
        data, type=TraceInfo, dec_hook=lambda typ, obj: Path(obj) if typ is Path else obj
    )


_encode_info, _decode_info = encode_info, decode_info


def _parse_one(
    path: Path, cache_dir: Path | None, store: bool, writer: Any = None
) -> tuple[TraceInfo, pl.DataFrame]:
    """read_trace, then (``store``) its cache entry, keyed by the file as it was before reading.

    ``writer`` (a one-thread executor) writes the entry in the background: polars encodes
    parquet without the GIL, so it overlaps with decoding the next file.
    """
    if not store:
        return read_trace(path)
    from tracekit import cache

    want = cache.key(path)
    info, frame = read_trace(path)
    if writer is not None:
        writer.submit(cache.store, path, info, frame, cache_dir, want)
    else:
        cache.store(path, info, frame, cache_dir, want)
    return info, frame


def _work(path: str, cache_dir: str | None = None, store: bool = False) -> tuple[str, bytes, bytes]:
    """Worker task: ("ok", info JSON, events IPC) or ("error", message, path): bytes only.

    The frame travels as lz4-compressed Arrow IPC: ~10x smaller than plain IPC (a 30 MB rank
    is 2 MB on the pipe), for the same CPU.
    """
    _pin_mmap_threshold()
    try:
        info, frame = _parse_one(Path(path), Path(cache_dir) if cache_dir else None, store)
    except TracekitError as err:
        message = str(err)
        prefix = f"{err.path}: " if err.path else ""
        return "error", message.removeprefix(prefix).encode(), (err.path or "").encode()
    return "ok", encode_info(info), frame.write_ipc(None, compression="lz4").getvalue()


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
    _pin_mmap_threshold()
    with ExitStack() as stack:
        if store and writer is None:
            writer = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="tracekit-cache"))
        pool = stack.enter_context(
            ThreadPoolExecutor(max(threads, 1), thread_name_prefix="tracekit-parse")
        )
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
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
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

    ``cache`` (tracekit.cache): False ignores it; None reads matching entries (beside each
    trace, or in ``cache_dir``) and parses the rest; True also writes an entry for every file
    it had to parse: in the background when ``cache_writer`` (an executor its owner waits for)
    is given, else before returning.

    ``executor`` (tracekit.engines: threads, processes or a Dask cluster): run the per-rank
    parse there (tracekit.rank_task) instead of choosing ``workers`` here.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise TracekitError("no trace files to read")
    hits: dict[Path, tuple[TraceInfo, pl.DataFrame]] = {}
    if cache is not False:
        from tracekit import cache as cache_mod

        for p in paths:
            found = cache_mod.load(p, cache_dir)
            if found is not None:
                hits[p] = found
    todo = [p for p in paths if p not in hits]
    if todo and executor is not None:
        from tracekit.rank_task import parse_ranks

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
    from tracekit.ingest.foreign import select_traces  # imports this module

    parsed = select_traces(parsed)
    parsed.sort(key=lambda pair: pair[0].rank)
    frames = [frame for _, frame in parsed]
    return [info for info, _ in parsed], pl.concat(frames, how="vertical", rechunk=False)
