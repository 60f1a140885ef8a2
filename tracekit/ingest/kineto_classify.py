"""The events table of one decoded trace (exactly tracekit.events.EVENT_SCHEMA): which rows,
their times, kind, device, stream, thread names and collective columns.

The string rules (kind, collective family, op) are polars expressions run once per distinct
(cat, name, coll_name), not once per event; the collective columns read the full args of the
few rows that have a family (tracekit.ingest.collectives holds the rules that change with
torch versions).

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
- ``device`` = "gpu" for the device categories of tracekit.ingest.devices (kernel, gpu_memcpy,
  gpu_memset, gpu_user_annotation, cuda_sync, ...); ``stream`` = ``args.stream`` there (else
  the numeric tid, which Kineto sets to the stream), null on CPU rows.
- ``kind``: see events.py. ``cpu_op`` rows named ``c10d::*``, ``_c10d_functional::*``,
  ``record_param_comms``, ``nccl:*`` or ``gloo:*`` are communication (calls and their waits);
  ``user_annotation`` rows are communication only when named ``gloo:*`` (the gloo transfer
  spans); ``nccl:*`` annotations on GPU traces stay "annotation" (the kernels are the transfer).
- ``correlation`` = ``args.correlation``; ``external_id`` = ``args["External id"]``.

Collective columns (``op``, ``bytes``, ``dtype``, ``group``, ``group_size``, ``group_ranks``,
``peer``), filled from what the row itself carries (op names, and what gives op null:
docs/labels.md):

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
  ``ReduceScatter``, ``Broadcast``, ``Reduce``); ``SendRecv`` and ``Generic`` give op null.
  kind stays "communication"; a later stage can take the op from the launching CPU call via
  correlation.
- ``_c10d_functional::*`` cpu_ops (DTensor / functional collectives) are communication with op
  null: each wraps a ``c10d::`` op that carries the op, so filling both would count it twice.
- barrier: bytes 0 (no payload). ``dtype`` is canonical torch naming (float32, bfloat16,
  int64, ...); an unknown spelling is kept as given, with bytes null.
- The same collective shows on several rows (CPU call, backend span, record_param_comms,
  kernel); count one family. GPU: kernels (device gpu, kind communication). CPU/gloo: the
  ``gloo:*`` spans for time, the ``c10d::*`` calls for the nominal op and peer.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from tracekit.events import EVENT_SCHEMA, empty_events
from tracekit.ingest import collectives as coll
from tracekit.ingest import devices
from tracekit.ingest.kineto_decode import Decoded, FullArgs, RawArgs, full_args, series

#: the events of a rank the cross-rank steps read (tracekit.ingest.rank_scan keeps them in the
#: driver; the rest of a rank's events wait in its spill): communication and annotations, step
#: markers, tracekit's ``comm:*`` labels
SLIM = (
    pl.col("kind").is_in(["communication", "annotation"])
    | pl.col("name").str.starts_with("ProfilerStep#")
    | pl.col("name").str.starts_with("comm:")
)

GPU_CATS = devices.DEVICE_CATS  # canonical names (tracekit.ingest.devices)
COMM_KERNEL = r"(?i)^(void )?(nccl|rccl)|ncclDevKernel|ncclKernel"
COMM_CPU_OP = r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|gloo:)|^record_param_comms$"
_TIME_LIMIT = float(2**62)  # |ns| bound: int64 arithmetic on start/end can never overflow


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


_CLASS_KEYS = ["cat", "name", "coll_name"]
#: the classes of the (cat, name, coll_name) seen so far in this process: ranks of a job share
#: their names, and classifying costs ~10 ms per rank whatever its size (the rules' regexes),
#: so each name is classified once. A pure function's memo, emptied past _MEMO_ROWS names.
_memo = pl.DataFrame()
_memo_lock = threading.Lock()
_MEMO_ROWS = 100_000


def _classes(frame: pl.DataFrame) -> pl.DataFrame:
    """kind, and the collective family / op / arg rules, of each distinct (cat, name,
    coll_name): the string rules (regexes) run once per distinct name, not once per event.
    Holds every name of FRAME, perhaps others (a left join on them reads what it needs)."""
    global _memo
    kind, family, op, rules = _class_exprs()
    names = frame.lazy().select(_CLASS_KEYS).unique()
    with _memo_lock:
        if _memo.height:
            names = names.join(_memo.lazy(), on=_CLASS_KEYS, how="anti", nulls_equal=True)
        todo = names.collect()
        if _memo.height and not todo.height:
            return _memo  # even on no rows, running the rules costs their ~3 ms
        new = (
            todo.lazy()
            .with_columns(kind)
            .with_columns(family)
            .with_columns(op)
            .with_columns(rules)
            .collect()
        )
        full = not _memo.height or _memo.height + new.height > _MEMO_ROWS
        _memo = new if full else pl.concat([_memo, new])
        return _memo


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


def _params_frame(idx: list[int], args: FullArgs) -> pl.DataFrame:
    """record_param_comms-style args of the rows that carry a ``Collective name``."""
    sub = [args[i] for i in idx]
    return pl.DataFrame(
        [
            pl.Series("i", idx, dtype=pl.Int64),
            series("in_nelems", [a.in_nelems for a in sub], pl.Int64),
            series("out_nelems", [a.out_nelems for a in sub], pl.Int64),
            series("p_dtype", [a.dtype for a in sub], pl.Utf8),
            series("p_group_size", [a.group_size for a in sub], pl.Int32),
            series("p_group", [a.pg_name for a in sub], pl.Utf8),
            series("p_group_ranks", [a.pg_ranks for a in sub], pl.Utf8),
            series("src_rank", [a.src_rank for a in sub], pl.Int32),
            series("dst_rank", [a.dst_rank for a in sub], pl.Int32),
        ]
    )


def _calls_frame(rows: list[tuple[int, int, str | None]], args: FullArgs) -> pl.DataFrame:
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
            series("c_bytes", [s[0] for s in sized], pl.Int64),
            series("c_dtype", [s[1] for s in sized], pl.Utf8),
            series("c_peer", peers, pl.Int32),
        ]
    )


def _collective_columns(
    calls: pl.DataFrame, args: FullArgs, group_size: int | None, warnings: list[str]
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


def _thread_names(threads: pl.DataFrame, raws: Sequence[RawArgs], path: Path) -> pl.DataFrame:
    """(pid, tid) -> every distinct thread_name metadata text, joined by " | " in file order.

    ``threads``: pid, tid (text) of the ``thread_name`` metadata events; ``raws``: their args.
    """
    frame = threads.with_columns(
        series("thread_name", [full_args(r, path).name for r in raws], pl.Utf8)
    )
    return (
        frame.drop_nulls()
        .group_by("pid", "tid", maintain_order=True)
        .agg(pl.col("thread_name").unique(maintain_order=True).str.join(" | "))
    )


def events_frame(
    decoded: Decoded,
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
        on=_CLASS_KEYS,
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
    collective = _collective_columns(calls, FullArgs(decoded.raw_args, path), group_size, warnings)
    threads = _thread_names(decoded.threads, decoded.thread_args, path)
    frame = frame.join(threads, on=["pid", "tid"], how="left", maintain_order="left").join(
        collective, on="i", how="left", maintain_order="left"
    )
    return frame.select([pl.col(c).cast(t) for c, t in EVENT_SCHEMA.items()])
