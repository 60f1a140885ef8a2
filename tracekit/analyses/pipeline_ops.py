"""Pipeline compute ops from the trace's labels, and each op's busy time.

Which spans are pipeline compute (each read from a CPU annotation):

- tracekit's labels (tracekit.labels): ``F|B|W:s<stage>:mb<m>[:v<version>[:st<staleness>]]``.
- torch.distributed.pipelining, torch 2.13 (seen in real traces made by tests/pipelining_job.py):
  ``ScheduleGPipe`` writes ``Forward <i>`` / ``Backward <i>`` (i = microbatch); the span also
  holds the blocking receive before the compute and the send launches after it. The stage is
  the rank's position among the ranks that carry these labels (rank r is stage r in a plain
  pipeline). ``Schedule1F1B`` labels nothing. Multi-stage schedules (``ScheduleInterleaved1F1B``,
  ``ScheduleLoopedBFS``, zero-bubble ones) write ``PP:<stage><action><mb>`` for every action:
  compute ``F``, ``B`` (full backward), ``I`` (backward for inputs: read as B) and ``W`` (for
  weights), besides ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``, ``UNSHARD``, ``RESHARD``,
  ``REDUCE_GRAD`` (not compute, ignored) and ``PP:(<a>;<b>)OVERLAP_F_B`` (ignored: two actions
  in one span cannot be told apart).

Busy time of a stage = its compute spans minus the blocking communication nested in them
(``c10d::*`` calls, and ``gloo:recv``/``nccl:recv`` spans that hold no compute op). torch's spans
are first narrowed to their first and last compute op, so ``Forward i`` counts only its compute,
not the receive before it nor the send launches after it. tracekit's labels wrap the compute and
nothing else (the p2p has its own ``comm:*`` spans), so they count whole: the Python that drives
the ops before the first one starts (``Module.__call__``, ``torch.autograd.backward`` setting up
the engine, 0.1-0.3 ms each on CPU) is the stage computing, not idle; narrowing them would count
it as bubble although the replay, fed the narrowed durations, has no gap for it. A rank holding

Frame ``pipeline_ops`` (rank, stage, step, kind, microbatch, version, start_ns, end_ns; start/end
the busy extent, as above).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from typing import Any

import polars as pl

from tracekit import labels

OPS_SCHEMA = {
    "rank": pl.Int32,
    "stage": pl.Int64,
    "step": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "version": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}
CANDIDATE = r"^(?:[FBW]:s\d+:mb\d+(?::v\d+)?(?::st\d+)?|Forward \d+|Backward \d+|PP:\d+[FIBW]\d+)$"
_TORCH_GPIPE = re.compile(r"^(Forward|Backward) (\d+)$")
_TORCH_ACTION = re.compile(r"^PP:(\d+)([FIBW])(\d+)$")
BLOCKING_SPANS = ("gloo:recv", "nccl:recv")


def parse_op(name: str) -> dict[str, Any] | None:
    """A compute span's kind/stage/microbatch/version/staleness and which scheme wrote it."""
    lab = labels.parse(name)
    if lab is not None and lab.family == "pipeline":
        return {
            "kind": lab.kind,
            "stage": lab.stage,
            "microbatch": lab.microbatch,
            "version": lab.version,
            "staleness": lab.staleness,
            "source": "tracekit",
        }
    m = _TORCH_GPIPE.match(name)
    if m:
        return {
            "kind": "F" if m[1] == "Forward" else "B",
            "stage": None,
            "microbatch": int(m[2]),
            "version": None,
            "staleness": None,
            "source": "torch_gpipe",
        }
    m = _TORCH_ACTION.match(name)
    if m:
        kind = "B" if m[2] == "I" else m[2]
        return {
            "kind": kind,
            "stage": int(m[1]),
            "microbatch": int(m[3]),
            "version": None,
            "staleness": None,
            "source": "torch_actions",
        }
    return None


def _raw_ops(events: pl.DataFrame) -> pl.DataFrame:
    """Pipeline compute annotations with their parsed fields (CPU annotations only)."""
    cand = events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("kind") == "annotation")
        & pl.col("name").str.contains(CANDIDATE)
    )
    if cand.height == 0:
        return pl.DataFrame()
    parsed = {n: op for n in cand["name"].unique().to_list() if (op := parse_op(n)) is not None}
    rows = [
        {**parsed[n], "rank": r, "tid": t, "name": n, "start_ns": s, "end_ns": e}
        for r, t, n, s, e in cand.select("rank", "tid", "name", "start_ns", "end_ns").iter_rows()
        if n in parsed
    ]
    if not rows:
        return pl.DataFrame()
    df = pl.DataFrame(
        rows,
        schema={
            "kind": pl.Utf8,
            "stage": pl.Int64,
            "microbatch": pl.Int64,
            "version": pl.Int64,
            "staleness": pl.Int64,
            "source": pl.Utf8,
            "rank": pl.Int32,
            "tid": pl.Utf8,
            "name": pl.Utf8,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
    )
    # torch ScheduleGPipe: stage = the rank's position among the ranks that carry the labels
    positions = {
        r: i
        for i, r in enumerate(
            sorted(df.filter(pl.col("stage").is_null())["rank"].unique().to_list())
        )
    }
    return df.with_columns(
        pl.coalesce(
            "stage", pl.col("rank").replace_strict(positions, default=None, return_dtype=pl.Int64)
        )
    ).sort("rank", "start_ns")


def _compute_extent(raw: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Narrow each of torch's spans to its first and last compute op on the same thread (torch's
    ``Forward i`` starts with a receive and ends with send launches); tracekit's hold only compute
    and stay whole."""
    comp = events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("cat") == "cpu_op")
        & (pl.col("kind") == "compute")
        & ~pl.col("name").str.starts_with("aten::empty")
    ).select("rank", "tid", "start_ns", "end_ns")
    if comp.height == 0:
        return raw
    first = comp.select("rank", "tid", pl.col("start_ns").alias("c0")).sort("c0")
    last = comp.select("rank", "tid", pl.col("end_ns").alias("c1")).sort("c1")
    out = (
        raw.sort("start_ns")
        .join_asof(
            first,
            left_on="start_ns",
            right_on="c0",
            by=["rank", "tid"],
            strategy="forward",
            check_sortedness=False,
        )
        .sort("end_ns")
        .join_asof(
            last,
            left_on="end_ns",
            right_on="c1",
            by=["rank", "tid"],
            strategy="backward",
            check_sortedness=False,
        )
    )
    ok = (
        (pl.col("source") != "tracekit")
        & pl.col("c0").is_not_null()
        & pl.col("c1").is_not_null()
        & (pl.col("c0") < pl.col("end_ns"))
        & (pl.col("c1") > pl.col("start_ns"))
        & (pl.col("c0") < pl.col("c1"))
    )
    return (
        out.with_columns(
            pl.when(ok).then(pl.col("c0")).otherwise(pl.col("start_ns")).alias("start_ns"),
            pl.when(ok).then(pl.col("c1")).otherwise(pl.col("end_ns")).alias("end_ns"),
        )
        .drop("c0", "c1")
        .sort("rank", "start_ns")
    )


def blocking_comm(
    events: pl.DataFrame,
) -> tuple[dict[int, list[tuple[int, int]]], set[tuple[int, int]]]:
    """Per rank, merged intervals of blocking communication on CPU: ``c10d::*`` calls, and recv
    spans inside which the thread ran no compute op (an ``irecv`` posted early and waited for
    later spans compute: that one is asynchronous, not blocking). Also the (rank, start) of the
    blocking recv spans."""
    cpu = events.filter(pl.col("device") == "cpu")
    calls = cpu.filter((pl.col("kind") == "communication") & (pl.col("cat") == "cpu_op"))
    spans = cpu.filter((pl.col("kind") == "communication") & pl.col("name").is_in(BLOCKING_SPANS))
    if spans.height:
        ops = (
            cpu.filter((pl.col("kind") == "compute") & (pl.col("cat") == "cpu_op"))
            .select("rank", "tid", pl.col("start_ns").alias("op_ns"))
            .sort("op_ns")
        )
        spans = (
            spans.sort("start_ns")
            .join_asof(
                ops,
                left_on="start_ns",
                right_on="op_ns",
                by=["rank", "tid"],
                strategy="forward",
                check_sortedness=False,
            )
            .filter(pl.col("op_ns").is_null() | (pl.col("op_ns") >= pl.col("end_ns")))
        )
    blocking_recvs = {(r, s) for r, s in spans.select("rank", "start_ns").iter_rows()}
    comm = pl.concat(
        [calls.select("rank", "start_ns", "end_ns"), spans.select("rank", "start_ns", "end_ns")]
    ).sort("rank", "start_ns")
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r, s, e in comm.iter_rows():
        iv = out[r]
        if iv and s <= iv[-1][1]:
            iv[-1] = (iv[-1][0], max(iv[-1][1], e))
        else:
            iv.append((s, e))
    return out, blocking_recvs


def _minus(
    start: int, end: int, holes: list[tuple[int, int]], starts: list[int]
) -> list[tuple[int, int]]:
    """[start, end) minus the sorted, merged ``holes`` (starts = their start times)."""
    pieces, cur = [], start
    i = max(0, bisect.bisect_right(starts, start) - 1)
    while i < len(holes) and holes[i][0] < end:
        hs, he = holes[i]
        if he > cur:
            if hs > cur:
                pieces.append((cur, min(hs, end)))
            cur = max(cur, he)
        i += 1
    if cur < end:
        pieces.append((cur, end))
    return pieces


def _assign_steps(ops: pl.DataFrame, markers: pl.DataFrame) -> pl.DataFrame:
    """Step = the rank's ProfilerStep marker holding the op's start (0 without markers)."""
    if markers.height == 0:
        return ops.with_columns(pl.lit(0, pl.Int64).alias("step"))
    mk = markers.select(
        pl.col("rank").cast(pl.Int32),
        pl.col("step").cast(pl.Int64),
        pl.col("start_ns").alias("m0"),
        pl.col("end_ns").alias("m1"),
    ).sort("m0")
    has = set(mk["rank"].unique().to_list())
    joined = ops.sort("start_ns").join_asof(
        mk,
        left_on="start_ns",
        right_on="m0",
        by="rank",
        strategy="backward",
        check_sortedness=False,
    )
    return (
        joined.with_columns(
            pl.when(~pl.col("rank").is_in(sorted(has)))
            .then(pl.lit(0, pl.Int64))
            .when(pl.col("start_ns") < pl.col("m1"))
            .then(pl.col("step"))
            .otherwise(None)
            .alias("step")
        )
        .filter(pl.col("step").is_not_null())
        .drop("m0", "m1")
        .sort("rank", "start_ns")
    )


def pipeline_ops(
    events: pl.DataFrame, markers: pl.DataFrame
) -> tuple[pl.DataFrame, dict[int, list[tuple[int, int]]], set[tuple[int, int]]]:
    """(ops frame with busy_ns and staleness, busy pieces per rank, the blocking receives of
    :func:`blocking_comm`) from the events; where the ops come from: :func:`ops_source`."""
    raw = _raw_ops(events)
    if raw.height == 0:
        return pl.DataFrame(schema=OPS_SCHEMA), {}, set()
    raw = _compute_extent(raw, events)
    holes, blocking = blocking_comm(events)
    rows: list[dict[str, Any]] = []
    pieces_by_rank: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    for op in raw.iter_rows(named=True):
        h = holes.get(op["rank"], [])
        pieces = (
            _minus(op["start_ns"], op["end_ns"], h, [x[0] for x in h])
            if h
            else [(op["start_ns"], op["end_ns"])]
        )
        if not pieces:
            continue
        pieces_by_rank[op["rank"]].extend(pieces)
        rows.append(
            {
                **op,
                "start_ns": pieces[0][0],
                "end_ns": pieces[-1][1],
                "busy_ns": sum(e - s for s, e in pieces),
            }
        )
    ops = pl.DataFrame(rows, schema={**raw.schema, "busy_ns": pl.Int64})
    ops = _assign_steps(ops, markers)
    return ops, {r: sorted(v) for r, v in pieces_by_rank.items()}, blocking


def ops_source(ops: pl.DataFrame) -> str | None:
    """Which naming the ops mostly follow (the most frequent ``source``; ties: the first name)."""
    return ops["source"].mode().sort()[0] if ops.height else None
