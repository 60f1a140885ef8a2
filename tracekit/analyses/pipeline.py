"""Pipeline bubbles: per stage and step, measured against theory and against a replay.

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
several stages (interleaved) is one device: its bubbles are computed over all its stages together.

Definitions (docs/metrics.md "Pipeline"):

- pipeline window of a step: first F start on any stage to last B (or W) end on any stage.
- bubble of a stage in a step: window time it is not busy, split into fill (before its first op),
  drain (after its last op) and steady (gaps between its ops). Time blocked in recv is bubble.
- bubble_fraction = sum of bubbles / (stages x sum of windows).
- bubble_fraction_span: the same over the whole profiled span (first to last step marker of all
  pipeline ranks), with the weight update (``optimizer`` / ``Optimizer.step#...``) counted as
  busy, since PipeDream updates after every microbatch; the number to compare asynchronous
  PipeDream (no flush, no windows) with GPipe.
- bubble_fraction_theory: (p-1)/(m+p-1) of the step for GPipe and 1F1B (arXiv:1811.06965);
  interleaved with v stages per rank (p-1)/(v m + p-1) (arXiv:2104.04473); None for PipeDream.
  ``bubble_fraction_theory_megatron`` is Megatron's (p-1)/m: bubble time relative to the ideal
  m (f+b), not a fraction of the step.
- bubble_fraction_replay: the schedule replayed (tracekit.analyses.replay) with the measured F and
  B busy durations per (stage, microbatch) and free communication: what the schedule alone
  costs; measured minus replay is what communication and contention add. GPipe/1F1B: each step
  replayed with its own durations (W folded into B), idle summed over the steps; PipeDream: one
  stream of all profiled steps with the median durations (its per-microbatch weight updates are
  not F/B: the replay leaves them out, and the measured windows count them as bubble).
- in-flight microbatches of a stage: forwards started whose backward has not ended (F and B of a
  microbatch paired in order; a backward whose forward came before the trace counts from the
  start). weight_versions (PipeDream): most distinct versions among in-flight microbatches.
- recv split: every receive is matched to its send on the peer (per (src, dst) pair, by
  microbatch where the label names it, else in order). transfer = the part of the receive after
  the send started; the rest is waiting for the upstream (or downstream) stage.

Frames: ``pipeline_ops`` (rank, stage, step, kind, microbatch, version, start_ns, end_ns; start/end
the busy extent, as above), ``bubbles`` (rank, stage, step, phase, start_ns, end_ns),
``pipeline_replay`` (stage, kind, microbatch, start_s, end_s).
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import polars as pl

from instrumented_runs import registry
from tracekit import labels, runfolder, theory
from tracekit.analyses.replay import replay

if TYPE_CHECKING:
    from tracekit.analyze import Inputs

NS = 1e-9
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
BUBBLES_SCHEMA = {
    "rank": pl.Int32,
    "stage": pl.Int64,
    "step": pl.Int64,
    "phase": pl.Utf8,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}
REPLAY_SCHEMA = {
    "stage": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "start_s": pl.Float64,
    "end_s": pl.Float64,
}

CANDIDATE = r"^(?:[FBW]:s\d+:mb\d+(?::v\d+)?(?::st\d+)?|Forward \d+|Backward \d+|PP:\d+[FIBW]\d+)$"
_TORCH_GPIPE = re.compile(r"^(Forward|Backward) (\d+)$")
_TORCH_ACTION = re.compile(r"^PP:(\d+)([FIBW])(\d+)$")
UPDATE = r"^(optimizer$|Optimizer\.step#)"
BLOCKING_SPANS = ("gloo:recv", "nccl:recv")
SOURCES = {
    "tracekit": "tracekit labels (F|B|W:s<stage>:mb<m>)",
    "torch_gpipe": "torch.distributed.pipelining ScheduleGPipe (Forward i / Backward i)",
    "torch_actions": "torch.distributed.pipelining multi-stage schedule (PP:<stage><F|I|B|W><mb>)",
}


# --- reading the labels ---------------------------------------------------------------------------


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
    parsed = {n: parse_op(n) for n in cand["name"].unique().to_list()}
    rows = [
        {**parsed[n], "rank": r, "tid": t, "name": n, "start_ns": s, "end_ns": e}
        for r, t, n, s, e in cand.select("rank", "tid", "name", "start_ns", "end_ns").iter_rows()
        if parsed.get(n) is not None
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


def _blocking_comm(
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
) -> tuple[pl.DataFrame, dict[int, list[tuple[int, int]]], str | None]:
    """(ops frame with busy_ns and staleness, busy pieces per rank, source) from the events."""
    raw = _raw_ops(events)
    if raw.height == 0:
        return pl.DataFrame(schema=OPS_SCHEMA), {}, None
    raw = _compute_extent(raw, events)
    holes, _ = _blocking_comm(events)
    rows, pieces_by_rank = [], defaultdict(list)
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
    source = ops["source"].mode().sort()[0] if ops.height else None
    return ops, {r: sorted(v) for r, v in pieces_by_rank.items()}, source


# --- per-stage quantities ---------------------------------------------------------------------------


def _pairs(ops: pl.DataFrame) -> list[tuple[int | None, int | None, int | None]]:
    """(F start, B end, version) of every microbatch of one stage: n-th F with n-th B of a mb."""
    fs, bs = defaultdict(list), defaultdict(list)
    for kind, mb, v, s, e in (
        ops.sort("start_ns")
        .select("kind", "microbatch", "version", "start_ns", "end_ns")
        .iter_rows()
    ):
        if kind == "F":
            fs[mb].append((s, v))
        elif kind == "B":
            bs[mb].append((e, v))
    out = []
    for mb in set(fs) | set(bs):
        f, b = fs.get(mb, []), bs.get(mb, [])
        lead = 0
        if b and (not f or b[0][0] < f[0][0]):
            lead = 1  # its forward ran before the trace began
            out.append((None, b[0][0], b[0][1]))
        for i, (s, v) in enumerate(f):
            j = i + lead
            out.append(
                (
                    s,
                    b[j][0] if j < len(b) else None,
                    v if v is not None else (b[j][1] if j < len(b) else None),
                )
            )
    return out


def inflight_and_versions(ops: pl.DataFrame) -> tuple[int, int | None]:
    """Max in-flight microbatches of one stage, and the most distinct weight versions in flight."""
    events = []
    for k, (s, e, v) in enumerate(_pairs(ops)):
        events.append((s if s is not None else -1, 1, k, v))
        if e is not None:
            events.append(
                (e, 0, k, v)
            )  # at equal times a backward's end frees before a forward adds
    live: dict[int, int | None] = {}
    peak, versions = 0, None
    for _t, add, k, v in sorted(events):
        if add:
            live[k] = v
        else:
            live.pop(k, None)
        peak = max(peak, len(live))
        vs = {x for x in live.values() if x is not None}
        if vs:
            versions = max(versions or 0, len(vs))
    return peak, versions


def _clip(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for s, e in pieces:
        s, e = max(s, lo), min(e, hi)
        if e > s:
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
    return out


def _gaps(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """Bubble intervals of one stage in [lo, hi): fill, steady gaps, drain."""
    if not pieces:
        return [("fill", lo, hi)] if hi > lo else []
    out = []
    if pieces[0][0] > lo:
        out.append(("fill", lo, pieces[0][0]))
    out += [("steady", a[1], b[0]) for a, b in zip(pieces, pieces[1:]) if b[0] > a[1]]
    if pieces[-1][1] < hi:
        out.append(("drain", pieces[-1][1], hi))
    return out


def recv_split(
    events: pl.DataFrame, stage_of_rank: dict[int, int], collectives: pl.DataFrame
) -> tuple[dict[int, dict[str, float]], str]:
    """Per rank: seconds blocked in recv split into transfer and waiting for the peer."""
    ann = events.filter(
        (pl.col("device") == "cpu")
        & pl.col("name").str.starts_with("comm:")
        & pl.col("name").str.contains(r"^comm:(send|recv):")
    ).select("rank", "name", "start_ns", "end_ns")
    rows = []
    for r, name, s, e in ann.iter_rows():
        lab = labels.parse(name)
        if lab is not None and lab.peer is not None:
            rows.append((r, lab.op, lab.what, lab.microbatch, lab.peer, s, e, True))
    method = "labels"
    if not rows and collectives.height:
        # no tracekit labels: the gloo/nccl p2p spans, matched in order; only receives that
        # block (no compute inside the span) count as time blocked in recv
        method = "p2p spans in order (blocking receives only)"
        _, blocking = _blocking_comm(events)
        p2p = collectives.filter(
            pl.col("op").is_in(["send", "recv"]) & pl.col("peer").is_not_null()
        )
        rows = [
            (r, op, None, None, peer, s, e, (r, s) in blocking)
            for r, op, peer, s, e in p2p.select(
                "rank", "op", "peer", "start_ns", "end_ns"
            ).iter_rows()
        ]
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, op, what, mb, peer, s, e, counted in sorted(rows, key=lambda x: x[5]):
        if op == "send":
            sends[(r, peer, what, mb)].append(s)
        else:
            recvs[(peer, r, what, mb)].append((s, e, counted))
    out = {
        r: {"recv_s": 0.0, "recv_transfer_s": 0.0, "recv_wait_s": 0.0, "recv_unmatched_s": 0.0}
        for r in stage_of_rank
    }
    for key, rs in recvs.items():
        ss = sends.get(key, [])
        # receives that ended before the pair's first traced send had their send before the trace
        offset = -sum(1 for _, e, _ in rs if ss and e <= ss[0]) if ss else -len(rs)
        for i, (s, e, counted) in enumerate(rs):
            if not counted:
                continue
            d = out.setdefault(
                key[1],
                {
                    "recv_s": 0.0,
                    "recv_transfer_s": 0.0,
                    "recv_wait_s": 0.0,
                    "recv_unmatched_s": 0.0,
                },
            )
            d["recv_s"] += (e - s) * NS
            j = i + offset
            if 0 <= j < len(ss):
                transfer = max(0, e - max(s, ss[j]))
                d["recv_transfer_s"] += transfer * NS
                d["recv_wait_s"] += (e - s - transfer) * NS
            else:
                d["recv_unmatched_s"] += (e - s) * NS
    return out, method


# --- schedule, m, replay ----------------------------------------------------------------------------


def _schedule(run: dict | None, ops: pl.DataFrame, source: str) -> str | None:
    declared = registry.schedule_of((run or {}).get("strategy"))  # our pipelines say theirs
    if declared is not None:
        return declared
    if source == "torch_gpipe":
        return "gpipe"
    if source == "torch_actions":
        per_rank = ops.group_by("rank").agg(pl.col("stage").n_unique().alias("n"))
        return "interleaved" if per_rank["n"].max() > 1 else "1f1b"
    if ops["version"].drop_nulls().len():
        return "pipedream"
    # all forwards of a step before its first backward, on every stage: GPipe; else 1F1B
    firsts = ops.group_by("stage", "step").agg(
        pl.col("start_ns").filter(pl.col("kind") == "B").min().alias("b0"),
        pl.col("start_ns").filter(pl.col("kind") == "F").max().alias("f1"),
    )
    return "gpipe" if (firsts["f1"] < firsts["b0"]).all() else "1f1b"


def _microbatches(run: dict | None, ops: pl.DataFrame) -> int:
    cfg = (run or {}).get("config") or {}
    m = (cfg.get("strategy_options") or {}).get("microbatches") or cfg.get("microbatches")
    if m:
        return int(m)
    per = ops.filter(pl.col("kind") == "F").group_by("stage", "step").len()
    return int(per["len"].max() or 1)


def _durations(ops: pl.DataFrame, p: int, m: int) -> tuple[list[list[float]], list[list[float]]]:
    """Median busy seconds of F and of B (+W) per (stage, microbatch j); gaps filled per stage."""
    tab = (
        ops.with_columns(
            (pl.col("microbatch") % m).alias("j"),
            pl.when(pl.col("kind") == "F").then(pl.lit("F")).otherwise(pl.lit("B")).alias("fb"),
        )
        .group_by("stage", "step", "microbatch", "j", "fb")
        .agg(pl.col("busy_ns").sum())
        .group_by("stage", "j", "fb")
        .agg(pl.col("busy_ns").median())
    )
    got = {
        (s, j, fb): v * NS for s, j, fb, v in tab.select("stage", "j", "fb", "busy_ns").iter_rows()
    }
    out = []
    for fb in ("F", "B"):
        table = []
        for s in range(p):
            mine = [got[(s, j, fb)] for j in range(m) if (s, j, fb) in got]
            fill = statistics.median(mine) if mine else 0.0
            table.append([got.get((s, j, fb), fill) for j in range(m)])
        out.append(table)
    return out[0], out[1]


def _backward_order(ops: pl.DataFrame) -> str:
    b = ops.filter((pl.col("stage") == 0) & (pl.col("kind") == "B")).sort("start_ns")
    mbs = b.filter(pl.col("step") == b["step"].min())["microbatch"].to_list() if b.height else []
    return "reverse" if len(mbs) > 1 and mbs == sorted(mbs, reverse=True) else "same"


# --- the section --------------------------------------------------------------------------------------


def _memory_of(path: Any, rank: int) -> dict:
    try:
        data = runfolder.load_json_if_present(runfolder.memory_path(path, rank))
    except Exception:  # noqa: BLE001 - a missing or odd side file only loses a column
        return {}
    return data if isinstance(data, dict) else {}


def analyse(inp: Inputs) -> tuple[dict | None, dict[str, pl.DataFrame], list[str]]:
    """The ``pipeline`` section of summary.json, its frames and warnings (None: no pipeline)."""
    ops, pieces, source = pipeline_ops(inp.events, inp.markers)
    if ops.height == 0:
        return None, {}, []
    warnings: list[str] = []
    run = inp.run
    schedule = _schedule(run, ops, source)
    m = _microbatches(run, ops)
    if m > ops.height:  # run.json's count sizes the replay's tables: never past the ops traced
        warnings.append(
            f"pipeline: run.json says {m} microbatches but the traces hold {ops.height} "
            "pipeline ops; counted from the traces"
        )
        m = _microbatches(None, ops)
    stages = sorted(ops["stage"].unique().to_list())
    ranks = sorted(ops["rank"].unique().to_list())
    stage_of_rank = {r: int(ops.filter(pl.col("rank") == r)["stage"].min()) for r in ranks}
    p_devices = len(ranks)
    v = max(1, len(stages) // max(1, p_devices))

    # pipeline windows: first F to last B/W of each step, over all stages
    win = (
        ops.group_by("step")
        .agg(
            pl.col("start_ns").filter(pl.col("kind") == "F").min().alias("lo"),
            pl.col("end_ns").filter(pl.col("kind") != "F").max().alias("hi"),
        )
        .sort("step")
    )
    win = win.filter(
        pl.col("lo").is_not_null() & pl.col("hi").is_not_null() & (pl.col("hi") > pl.col("lo"))
    )
    bubble_rows, per = [], {r: defaultdict(float) for r in ranks}
    for step, lo, hi in win.iter_rows():
        for r in ranks:
            mine = _clip(pieces.get(r, []), lo, hi)
            per[r]["busy"] += sum(e - s for s, e in mine)
            per[r]["window"] += hi - lo
            for phase, s, e in _gaps(mine, lo, hi):
                per[r][phase] += e - s
                bubble_rows.append(
                    {
                        "rank": r,
                        "stage": stage_of_rank[r],
                        "step": step,
                        "phase": phase,
                        "start_ns": s,
                        "end_ns": e,
                    }
                )
    total_window = sum(per[r]["window"] for r in ranks)
    bubble_fraction = (
        (sum(per[r]["window"] - per[r]["busy"] for r in ranks) / total_window)
        if total_window
        else None
    )

    # the whole profiled span, with weight updates as busy time
    wins = inp.windows.filter(pl.col("rank").is_in(ranks))
    span_lo, span_hi = int(wins["start_ns"].min()), int(wins["end_ns"].max())
    updates = inp.events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("kind") == "annotation")
        & pl.col("name").str.contains(UPDATE)
        & pl.col("rank").is_in(ranks)
    )
    upd = defaultdict(list)
    for r, s, e in updates.select("rank", "start_ns", "end_ns").iter_rows():
        upd[r].append((s, e))
    span_idle = 0
    for r in ranks:
        busy = _clip(sorted(pieces.get(r, []) + upd[r]), span_lo, span_hi)
        per[r]["span_busy"] = sum(e - s for s, e in busy)
        span_idle += (span_hi - span_lo) - per[r]["span_busy"]
    span = span_hi - span_lo
    bubble_fraction_span = span_idle / (p_devices * span) if span > 0 else None

    # theory and replay (over the whole pipeline: a --ranks subset gets theory, not a replay)
    p_run = ((run or {}).get("config") or {}).get("strategy_options", {}).get("stages")
    p = int(p_run) if p_run else p_devices
    # len first: p is run.json's word, and list(range(p)) would be as long as it says
    complete = schedule == "interleaved" or (
        len(stages) == p == p_devices and stages == list(range(p))
    )
    theory_value = None
    if schedule in ("gpipe", "1f1b"):
        theory_value = theory.pipeline_bubble_fraction(p, m)
    elif schedule == "interleaved":
        theory_value = theory.pipeline_bubble_fraction(p, m, v)
    megatron = (
        theory.megatron_bubble_ratio(p, m, v if schedule == "interleaved" else 1)
        if schedule != "pipedream"
        else None
    )
    replay_value, replay_frame = None, pl.DataFrame(schema=REPLAY_SCHEMA)
    if not complete:
        warnings.append(f"pipeline: the traces hold stages {stages} of {p}: no replay")
    elif schedule == "pipedream":
        # one stream over the profiled steps, median durations per (stage, microbatch)
        f, b = _durations(ops, p, m)
        res = replay(schedule, p, m, f, b, steps=max(1, win.height))
        replay_value = res.bubble_fraction
        replay_frame = res.ops.select(
            "stage",
            "kind",
            (pl.col("step") * m + pl.col("microbatch")).alias("microbatch"),
            pl.col("start").alias("start_s"),
            pl.col("end").alias("end_s"),
        ).cast(REPLAY_SCHEMA)
    elif schedule in ("gpipe", "1f1b"):
        # each step replayed with its own measured durations; the replays laid back to back
        idle = total = offset = 0.0
        parts = []
        order = _backward_order(ops) if schedule == "gpipe" else "same"
        for step in win["step"].to_list():
            f, b = _durations(ops.filter(pl.col("step") == step), p, m)
            res = replay(schedule, p, m, f, b, backward_order=order)
            idle += res.bubble_fraction * p * res.makespan
            total += p * res.makespan
            parts.append(
                res.ops.select(
                    "stage",
                    "kind",
                    "microbatch",
                    (pl.col("start") + offset).alias("start_s"),
                    (pl.col("end") + offset).alias("end_s"),
                ).cast(REPLAY_SCHEMA)
            )
            offset += res.makespan
        replay_value = idle / total if total else None
        replay_frame = pl.concat(parts) if parts else replay_frame
    elif schedule is not None:
        warnings.append(
            f"pipeline: no replay for the {schedule} schedule (several stages per rank)"
        )

    recv, recv_method = recv_split(inp.events, stage_of_rank, inp.collectives)
    path_is_run = run is not None and hasattr(inp.path, "is_dir") and inp.path.is_dir()
    per_stage = []
    for r in ranks:
        mine = ops.filter(pl.col("rank") == r)
        by_stage = [
            inflight_and_versions(mine.filter(pl.col("stage") == s))
            for s in sorted(mine["stage"].unique().to_list())
        ]
        stale = mine.filter(pl.col("kind") == "B")["staleness"].drop_nulls()
        mem = _memory_of(inp.path, r) if path_is_run else {}
        rs = recv.get(r, {})
        row = {
            "stage": stage_of_rank[r],
            "rank": r,
            "stages_on_rank": sorted(mine["stage"].unique().to_list()),
            "fill_s": per[r]["fill"] * NS,
            "steady_s": per[r]["steady"] * NS,
            "drain_s": per[r]["drain"] * NS,
            "busy_s": per[r]["busy"] * NS,
            "window_s": per[r]["window"] * NS,
            "bubble_fraction": (1 - per[r]["busy"] / per[r]["window"])
            if per[r]["window"]
            else None,
            "bubble_fraction_span": (1 - per[r]["span_busy"] / span) if span > 0 else None,
            "max_inflight_microbatches": max(x[0] for x in by_stage),
            "activation_peak_bytes": mem.get("activation_peak_bytes"),
            "activation_bytes_per_microbatch": mem.get("activation_bytes_per_microbatch"),
            "weight_versions": max((x[1] for x in by_stage if x[1] is not None), default=None),
            "staleness_max": int(stale.max()) if stale.len() else None,
            "staleness_mean": float(stale.mean()) if stale.len() else None,
            "recv_s": rs.get("recv_s", 0.0),
            "recv_wait_s": rs.get("recv_wait_s", 0.0),
            "recv_transfer_s": rs.get("recv_transfer_s", 0.0),
            "recv_unmatched_s": rs.get("recv_unmatched_s", 0.0),
        }
        per_stage.append(row)
    per_stage.sort(key=lambda x: x["stage"])

    summary = {
        "schedule": schedule,
        "source": SOURCES.get(source, source),
        "stages": p,
        "virtual_stages": len(stages),
        "microbatches": m,
        "steps": win.height,
        "bubble_fraction": bubble_fraction,
        "bubble_fraction_span": bubble_fraction_span,
        "bubble_fraction_theory": theory_value,
        "bubble_fraction_theory_basis": "fraction of the step: (p-1)/(m+p-1)"
        if theory_value is not None and schedule != "interleaved"
        else ("fraction of the step: (p-1)/(v m+p-1)" if theory_value is not None else None),
        "bubble_fraction_theory_megatron": megatron,
        "bubble_fraction_theory_megatron_basis": "bubble time / ideal time m(f+b): (p-1)/m"
        if megatron is not None
        else None,
        "bubble_fraction_replay": replay_value,
        "window_s": (total_window / max(1, win.height) / max(1, p_devices)) * NS
        if total_window
        else None,
        "span_s": span * NS,
        "recv_split_method": recv_method,
        "per_stage": per_stage,
    }
    frames = {
        "pipeline_ops": ops.select(list(OPS_SCHEMA)).cast(OPS_SCHEMA).sort("rank", "start_ns"),
        "bubbles": pl.DataFrame(bubble_rows, schema=BUBBLES_SCHEMA).sort("rank", "start_ns"),
        "pipeline_replay": replay_frame,
    }
    return summary, frames, warnings


def table(summary: dict) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows) of the pipeline table `tracekit analyze` prints."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    title = (
        f"pipeline {summary['schedule']}: p={summary['stages']} m={summary['microbatches']}  bubble "
        f"{pct(summary['bubble_fraction'])} (replay {pct(summary['bubble_fraction_replay'])}, theory "
        f"{pct(summary['bubble_fraction_theory'])}), whole span {pct(summary['bubble_fraction_span'])}"
    )
    head = [
        "stage",
        "rank",
        "fill s",
        "steady s",
        "drain s",
        "bubble",
        "in flight",
        "act peak MB",
        "versions",
        "recv wait s",
        "recv transfer s",
    ]
    rows = []
    for s in summary["per_stage"]:
        act = s.get("activation_peak_bytes")
        rows.append(
            [
                str(s["stage"]),
                str(s["rank"]),
                f"{s['fill_s']:.4f}",
                f"{s['steady_s']:.4f}",
                f"{s['drain_s']:.4f}",
                pct(s["bubble_fraction"]),
                str(s["max_inflight_microbatches"]),
                "-" if act is None else f"{act / 1e6:.2f}",
                "-" if s["weight_versions"] is None else str(s["weight_versions"]),
                f"{s['recv_wait_s']:.4f}",
                f"{s['recv_transfer_s']:.4f}",
            ]
        )
    return title, head, rows
