"""Read Kineto (torch.profiler) Chrome-trace files into the events table (tracekit.events).

Why it looks like this: parse speed is a product feature (HTA needs ~0.8 CPU-s per 10 MB rank).
A file is gunzipped once, decoded by msgspec straight into typed Structs that declare only the
fields used (unknown keys are skipped without building dicts), turned into columns by one list
comprehension per field, and classified with vectorised polars expressions. Only the few rows
that are collective calls get per-row Python, to read their nested ``Input Dims``.

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
- barrier: bytes 0 (no payload). Ops outside the DESIGN list (gather, scatter, coalesced
  markers, ``wait``) give op null. ``dtype`` is canonical torch naming (float32, bfloat16,
  int64, ...); an unknown spelling is kept as given, with bytes null.
- The same collective shows on several rows (CPU call, backend span, record_param_comms,
  kernel); count one family. GPU: kernels (device gpu, kind communication). CPU/gloo: the
  ``gloo:*`` spans for time, the ``c10d::*`` calls for the nominal op and peer.

Ranks: ``distributedInfo.rank``, else the ``rank`` argument, else ``rank<N>``/``rank-<N>``/
``rank_<N>`` in the file name (runfolder.rank_from_filename; never other digits), else 0 with
a warning. :func:`read_traces` refuses a defaulted rank when given several files and refuses
two files with one rank. It parses files in spawned worker processes (fork is unsafe once
polars' thread pool runs); frames come back as Arrow IPC bytes, metadata as JSON.
"""
from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import sys
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit.errors import TracekitError
from tracekit.events import EVENT_SCHEMA, empty_events
from tracekit.ingest import collectives as coll
from tracekit.runfolder import rank_from_filename

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
COMM_KERNEL = r"(?i)^(void )?(nccl|rccl)|ncclDevKernel|ncclKernel"
COMM_CPU_OP = r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|gloo:)|^record_param_comms$"
_TIME_LIMIT = float(2**62)  # |ns| bound: int64 arithmetic on start/end can never overflow
_RANK_LIMIT = 2**31
NO_RANK_WARNING = "no rank in distributedInfo or file name; taken as rank 0"
_POOL_MIN_BYTES = 16 * 2**20  # below this much trace on disk, worker start-up costs more


@dataclass(frozen=True)
class TraceInfo:
    """What one trace file says about itself, and what ingest had to drop or guess."""

    path: Path
    rank: int
    rank_source: str            # "distributedInfo" | "argument" | "filename" | "default"
    world_size: int | None
    backend: str | None         # "gloo" | "nccl" | ...
    host_name: str | None
    base_ns: int | None         # baseTimeNanoseconds
    pg_config: tuple[dict, ...]  # distributedInfo.pg_config as given
    device_properties: tuple[dict, ...]
    has_gpu: bool               # any kernel / gpu_memcpy / gpu_memset events
    profiler_steps: int         # number of ProfilerStep#N annotations
    warnings: tuple[str, ...]   # one line each: what is missing or was dropped


# --- decoding ------------------------------------------------------------------------------

_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` keys ingest reads; loose types because real traces vary."""

    name: Any = None                        # thread_name metadata
    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]  # noqa: N815 - the file's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None


def _read_bytes(path: Path) -> bytes:
    """The file's JSON bytes: gunzipped in one call when it starts with the gzip magic."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    if not data:
        raise TracekitError("empty file", path)
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        data = gzip.decompress(data)
    except EOFError:
        raise TracekitError("truncated gzip file (it ends before its end marker)", path) from None
    except (gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise TracekitError(f"corrupt gzip data ({exc})", path) from None
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
    base_ns = _as_int(base, -(2**62), 2**62)
    if base is not None and base_ns is None:
        warnings.append(f"baseTimeNanoseconds {str(base)[:40]!r} is not usable; "
                        "times taken as given")
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


def _choose_rank(path: Path, meta_rank: int | None, rank: int | None,
                 warnings: list[str]) -> tuple[int, str]:
    from_name = _as_int(rank_from_filename(path.name), 0, _RANK_LIMIT)
    if rank is not None and _as_int(rank, 0, _RANK_LIMIT) is None:
        raise TracekitError(f"rank {rank!r} is not a rank (0 <= rank < 2**31)", path)
    if meta_rank is not None:
        if from_name is not None and from_name != meta_rank:
            warnings.append(f"file name says rank {from_name} but distributedInfo says "
                            f"{meta_rank}; using {meta_rank}")
        return meta_rank, "distributedInfo"
    if rank is not None:
        return rank, "argument"
    if from_name is not None:
        return from_name, "filename"
    warnings.append(NO_RANK_WARNING)
    return 0, "default"


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
    """pid/tid as text. They take few distinct values, so each is converted once (2x faster)."""
    try:
        text = {v: v if v.__class__ is str else None if v is None else str(v) for v in set(values)}
        return pl.Series(name, [text[v] for v in values], dtype=pl.Utf8)
    except (TypeError, KeyError):  # unhashable (a list where an id belongs) or NaN
        kept = [v if v.__class__ in (str, int, float) else None for v in values]
        return pl.Series(name, [v if v is None or v.__class__ is str else str(v) for v in kept],
                         dtype=pl.Utf8)


def _base_frame(xs: list[_Event], args: list[_Args]) -> pl.DataFrame:
    """Raw columns of the X events, one comprehension each, in file order (column ``i``)."""
    return pl.DataFrame([
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
    ])


def _params_frame(idx: list[int], args: list[_Args]) -> pl.DataFrame:
    """record_param_comms-style args of the rows that carry a ``Collective name``."""
    sub = [args[i] for i in idx]
    return pl.DataFrame([
        pl.Series("i", idx, dtype=pl.Int64),
        _series("in_nelems", [a.in_nelems for a in sub], pl.Int64),
        _series("out_nelems", [a.out_nelems for a in sub], pl.Int64),
        _series("p_dtype", [a.dtype for a in sub], pl.Utf8),
        _series("p_group_size", [a.group_size for a in sub], pl.Int32),
        _series("p_group", [a.pg_name for a in sub], pl.Utf8),
        _series("p_group_ranks", [a.pg_ranks for a in sub], pl.Utf8),
        _series("src_rank", [a.src_rank for a in sub], pl.Int32),
        _series("dst_rank", [a.dst_rank for a in sub], pl.Int32),
    ])


def _calls_frame(rows: list[tuple[int, int, str | None]], args: list[_Args]) -> pl.DataFrame:
    """Bytes/dtype/peer of c10d and backend calls, read from their nested Input Dims."""
    sized = [coll.call_bytes(args[i].input_dims, args[i].input_type, k) for i, k, _ in rows]
    peers = [coll.concrete_int(args[i].concrete, coll.P2P_PEER_ARG)
             if op in ("send", "recv") and k >= 0 else None for i, k, op in rows]
    return pl.DataFrame([
        pl.Series("i", [r[0] for r in rows], dtype=pl.Int64),
        _series("c_bytes", [s[0] for s in sized], pl.Int64),
        _series("c_dtype", [s[1] for s in sized], pl.Utf8),
        _series("c_peer", peers, pl.Int32),
    ])


def _thread_names(events: list[_Event]) -> pl.DataFrame:
    """(pid, tid) -> every distinct thread_name metadata text, joined by " | " in file order."""
    meta = [(e.pid, e.tid, e.args.name) for e in events
            if e.ph == "M" and e.name == "thread_name" and e.args is not None]
    frame = pl.DataFrame([
        _text_series("pid", [m[0] for m in meta]),
        _text_series("tid", [m[1] for m in meta]),
        _series("thread_name", [m[2] for m in meta], pl.Utf8),
    ])
    return (frame.drop_nulls().group_by("pid", "tid", maintain_order=True)
            .agg(pl.col("thread_name").unique(maintain_order=True).str.join(" | ")))


def _kind_expr() -> pl.Expr:
    cat, name = pl.col("cat"), pl.col("name")
    return (
        pl.when(cat == "kernel")
        .then(pl.when(name.str.contains(COMM_KERNEL)).then(pl.lit("communication"))
              .otherwise(pl.lit("compute")))
        .when(cat.is_in(["gpu_memcpy", "gpu_memset"])).then(pl.lit("memory"))
        .when(cat == "cuda_sync").then(pl.lit("sync"))
        .when(cat == "cpu_op")
        .then(pl.when(name.str.contains(COMM_CPU_OP)).then(pl.lit("communication"))
              .otherwise(pl.lit("compute")))
        .when(cat == "user_annotation")
        .then(pl.when(name.str.starts_with("gloo:")).then(pl.lit("communication"))
              .otherwise(pl.lit("annotation")))
        .when(cat == "gpu_user_annotation").then(pl.lit("annotation"))
        .when(cat.is_in(["cuda_runtime", "cuda_driver"])).then(pl.lit("runtime"))
        .otherwise(pl.lit("other"))
    )


def _drop_bad_times(frame: pl.DataFrame, base_ns: int | None,
                    warnings: list[str]) -> pl.DataFrame:
    """Keep rows whose ts/dur are finite numbers, dur >= 0, and whose ns fit in int64."""
    ts, dur = pl.col("ts"), pl.col("dur")
    numeric = (ts.is_finite() & dur.is_finite() & (dur >= 0)).fill_null(False)
    fits = ((ts * 1000 + (base_ns or 0)).abs() + dur * 1000 < _TIME_LIMIT).fill_null(False)
    counts = frame.select(bad=(~numeric).sum(), big=(numeric & ~fits).sum()).row(0)
    if counts[0]:
        warnings.append(f"dropped {counts[0]} events with missing/negative/NaN durations "
                        "or non-numeric timestamps")
    if counts[1]:
        warnings.append(f"dropped {counts[1]} events whose times do not fit in 64-bit nanoseconds")
    return frame.filter(numeric & fits) if any(counts) else frame


def _time_exprs(base_ns: int | None) -> list[pl.Expr]:
    """Exact integer ns: whole microseconds x 1000 plus the rounded fraction."""
    ts, dur = pl.col("ts"), pl.col("dur")
    whole = ts.floor()
    start = (pl.lit(base_ns or 0, dtype=pl.Int64) + whole.cast(pl.Int64) * 1000
             + ((ts - whole) * 1000).round().cast(pl.Int64))
    return [start.alias("start_ns"),
            (start + (dur * 1000).round().cast(pl.Int64)).alias("end_ns")]


def _collective_columns(frame: pl.DataFrame, args: list[_Args], group_size: int | None,
                        warnings: list[str]) -> pl.DataFrame:
    """``i`` plus op, bytes, dtype, group, group_size, group_ranks, peer of the collective rows.

    Families and ops are found vectorised over all rows; everything after that runs on the few
    rows that have a family (see the module docstring for the rules).
    """
    calls = (frame.lazy().select("i", "cat", "name", "kind", "coll_name")
             .with_columns(coll.family_expr().alias("family"))
             .filter(pl.col("family").is_not_null())
             .with_columns(coll.op_expr().alias("op"))
             .with_columns(coll.arg_rule_exprs()).collect())
    params_idx = calls.filter(pl.col("family") == "params")["i"].to_list()
    params = (_params_frame(params_idx, args).join(calls.select("i", "op"), on="i", how="left")
              .with_columns(coll.params_exprs()).drop("op"))
    sized_rows = (calls.filter(pl.col("op").is_not_null() & pl.col("arg_index").is_not_null()
                               & (pl.col("op") != "barrier"))
                  .select("i", "arg_index", "op").rows())
    calls = (calls.join(params, on="i", how="left")
             .join(_calls_frame(sized_rows, args), on="i", how="left"))
    unknown_n = calls.filter(pl.col("scale_n") & pl.col("c_bytes").is_not_null()).height
    if unknown_n and not group_size:
        warnings.append(f"bytes left null for {unknown_n} all_gather/reduce_scatter calls: the "
                        "group size is unknown (pg_config lists groups of several sizes, or none)")
    is_call = pl.col("family").is_in(["c10d", "backend"]) & pl.col("op").is_not_null()
    return calls.select(
        "i", "op",
        pl.when(pl.col("op") == "barrier").then(pl.lit(0, dtype=pl.Int64))
        .when(pl.col("family") == "params").then(pl.col("p_bytes"))
        .when(pl.col("scale_n"))
        .then(coll.safe_product(pl.col("c_bytes"), pl.lit(group_size, dtype=pl.Int64)))
        .otherwise(pl.col("c_bytes")).alias("bytes"),
        pl.coalesce("p_dtype_c", "c_dtype").alias("dtype"),
        pl.col("p_group").alias("group"),
        pl.when(pl.col("family") == "params").then(pl.col("p_group_size"))
        .when(is_call).then(pl.lit(group_size, dtype=pl.Int32)).alias("group_size"),
        pl.col("p_group_ranks").alias("group_ranks"),
        pl.coalesce("p_peer", "c_peer").alias("peer"),
    )


def _events_frame(trace: _Trace, rank: int, base_ns: int | None, group_size: int | None,
                  warnings: list[str]) -> pl.DataFrame:
    """The events table of one decoded trace, exactly EVENT_SCHEMA."""
    events = trace.traceEvents
    xs = [e for e in events if e.ph == "X"]
    if not xs:
        warnings.append("no complete (ph 'X') events")
        return empty_events()
    empty = _Args()
    args = [e.args or empty for e in xs]
    frame = _drop_bad_times(_base_frame(xs, args), base_ns, warnings)
    is_gpu = pl.col("cat").is_in(GPU_CATS)
    frame = frame.with_columns(
        *_time_exprs(base_ns),
        _kind_expr().alias("kind"),
        pl.when(is_gpu).then(pl.lit("gpu")).otherwise(pl.lit("cpu")).alias("device"),
        pl.when(is_gpu).then(pl.coalesce("stream_arg", pl.col("tid").cast(pl.Int64, strict=False)))
        .alias("stream"),
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
    )
    frame = (frame.join(_thread_names(events), on=["pid", "tid"], how="left", maintain_order="left")
             .join(_collective_columns(frame, args, group_size, warnings), on="i", how="left",
                   maintain_order="left"))
    return frame.select([pl.col(c).cast(t) for c, t in EVENT_SCHEMA.items()])


def _count_steps(frame: pl.DataFrame) -> int:
    steps = frame.filter((pl.col("device") == "cpu")
                         & pl.col("name").str.contains(r"^ProfilerStep#\d+$"))
    return steps["name"].n_unique()


# --- public API ----------------------------------------------------------------------------


def read_trace(path: Path, rank: int | None = None) -> tuple[TraceInfo, pl.DataFrame]:
    """Read one Kineto trace (``.json`` or gzip) into (metadata, events with EVENT_SCHEMA).

    ``rank`` is used only when the trace has no ``distributedInfo.rank``; a file name's
    ``rank<N>`` comes next, then rank 0 with a warning. Any problem with the file is a
    TracekitError naming it.
    """
    path = Path(path)
    trace = _decode(_read_bytes(path), path)
    warnings: list[str] = []
    meta = _meta(trace, warnings)
    chosen, source = _choose_rank(path, meta.pop("rank"), rank, warnings)
    group_size = uniform_group_size(meta["pg_config"])
    frame = _events_frame(trace, chosen, meta["base_ns"], group_size, warnings)
    info = TraceInfo(
        path=path, rank=chosen, rank_source=source, **meta,
        has_gpu=bool(frame["cat"].is_in(["kernel", "gpu_memcpy", "gpu_memset"]).any()),
        profiler_steps=_count_steps(frame), warnings=tuple(warnings),
    )
    return info, frame


def _encode_info(info: TraceInfo) -> bytes:
    return msgspec.json.encode(info, enc_hook=str)


def _decode_info(data: bytes) -> TraceInfo:
    return msgspec.json.decode(data, type=TraceInfo,
                               dec_hook=lambda typ, obj: Path(obj) if typ is Path else obj)


def _work(path: str) -> tuple[str, bytes, bytes]:
    """Worker task: ("ok", info JSON, events IPC) or ("error", message, path): bytes only."""
    try:
        info, frame = read_trace(Path(path))
    except TracekitError as err:
        message = str(err)
        prefix = f"{err.path}: " if err.path else ""
        return "error", message.removeprefix(prefix).encode(), (err.path or "").encode()
    return "ok", _encode_info(info), frame.write_ipc(None).getvalue()


def _default_workers(paths: list[Path]) -> int:
    """One per file up to the CPUs this process may use; none for small inputs.

    Starting a spawned worker costs about half a second (a fresh interpreter importing
    polars), the time to parse ~5 MB of gzipped trace, so small run folders parse faster here.
    """
    total = sum(p.stat().st_size for p in paths if p.is_file())
    if total < _POOL_MIN_BYTES:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(len(paths), cpus or 1)


def _spawn_can_start() -> bool:
    """False when spawned workers could not re-import ``__main__`` (code fed on stdin)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return True
    main_path = getattr(main, "__file__", None)
    return main_path is None or os.path.isfile(main_path)


def _parse_all(paths: list[Path], workers: int) -> list[tuple[TraceInfo, pl.DataFrame]]:
    """Parse each file in a spawned worker (fork is unsafe once polars' threads run)."""
    if workers <= 1 or not _spawn_can_start():
        return [read_trace(p) for p in paths]
    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = list(pool.map(_work, [str(p) for p in paths]))
    except BrokenProcessPool:
        raise TracekitError(
            "a worker process died while reading traces (out of memory, or a script that calls "
            "tracekit without an `if __name__ == '__main__':` guard); try workers=1") from None
    out = []
    for status, first, second in results:
        if status == "error":
            raise TracekitError(first.decode(), second.decode() or None)
        out.append((_decode_info(first), pl.read_ipc(second)))
    return out


def _check_ranks(infos: list[TraceInfo]) -> None:
    seen: dict[int, Path] = {}
    for info in infos:
        if len(infos) > 1 and info.rank_source == "default":
            raise TracekitError("no rank in distributedInfo or file name, and several trace "
                                "files were given: name it rank<N>", info.path)
        if info.rank in seen:
            raise TracekitError(f"rank {info.rank} is claimed by {seen[info.rank]} too",
                                info.path)
        seen[info.rank] = info.path


def read_traces(paths: Sequence[Path],
                workers: int | None = None) -> tuple[list[TraceInfo], pl.DataFrame]:
    """Read several ranks' traces in parallel: infos sorted by rank, one events frame.

    ``workers``: worker processes, one file per task; default one per file up to the usable
    CPUs, or none (parse here) when the files total under 16 MiB; 1 parses here. One file is
    always parsed here and its rank may default to 0 with a warning; several files each need
    a rank of their own, and distinct ones, else TracekitError.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise TracekitError("no trace files to read")
    if workers is None:
        workers = _default_workers(paths)
    parsed = _parse_all(paths, min(workers, len(paths)))
    _check_ranks([info for info, _ in parsed])
    parsed.sort(key=lambda pair: pair[0].rank)
    frames = [frame for _, frame in parsed]
    return [info for info, _ in parsed], pl.concat(frames, how="vertical")
