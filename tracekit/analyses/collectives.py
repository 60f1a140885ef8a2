"""Collective calls per rank, their sizes and bandwidth (nccl-tests definitions, docs/metrics.md "Collectives").

CPU/gloo traces show a collective twice: a short ``c10d::<op>`` call on the calling thread (the
op the program asked for, with its tensors) and a ``gloo:<op>`` span on a runloop thread (what
gloo really ran, and when). Nothing links the two but order, time and size: each process group
runs on runloop threads of its own, so with several groups the spans do not start in the calls'
order. A span takes the first earlier, still unpaired call whose op gloo would run as the span's
op, whose size agrees (the call's, or its flight-recorder entry's: tensor-list calls carry no
dtype) and whose group is the one the span's thread served before (``_pair_rank``); p2p spans
run on the calling thread and pair in order. gloo runs reduce-scatter as a full all-reduce,
which this pairing exposes (op reduce_scatter, wire_op all_reduce, wire_bytes the full input).
GPU/NCCL traces carry the collective on the kernel itself (record_param_comms args); kernels
without them keep the op their name tells and unknown bytes.

busbw factors (n = group size): all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
(n-1)/n; broadcast, reduce, send, recv 1. ``ideal_bytes_per_rank`` = sum of S x factor, the
ZeRO paper's per-rank communication volume under ideal ring algorithms.

Process groups and cross-rank matching (tracekit.analyses.groups, .matching): every row gets its
process group (``group`` = the c10d group name, ``group_desc``, ``group_ranks``, ``dim``) and
its sequence number in that group (``group_seq``), then the k-th call of group G is matched
across G's ranks: ``transfer_ns`` = the shortest of the matched durations, ``wait_ns`` = the
rest of each rank's span (torch-tb-profiler's method); both stay null when a member rank is
missing (``complete`` false). Matching runs on every call of the trace, before the window
filter, so a call stays matched when one rank's window cuts it.
"""

from __future__ import annotations

from typing import Any

import polars as pl

#: the frame ``collectives``: one row per collective call per rank in the window, matched
#: across ranks (:func:`collectives_table`; tracekit.analyses.matching adds group to duration_s)
COLLECTIVES_SCHEMA = {
    "rank": pl.Int32,
    "seq": pl.Int32,
    "op": pl.Utf8,
    "bytes": pl.Int64,
    "wire_op": pl.Utf8,
    "wire_bytes": pl.Int64,
    "group_size": pl.Int32,
    "peer": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "thread": pl.Utf8,
    "device": pl.Utf8,
    "call_start_ns": pl.Int64,
    "call_end_ns": pl.Int64,
    "algorithm": pl.Utf8,
    "protocol": pl.Utf8,
    "group_ranks_text": pl.Utf8,
    "group": pl.Utf8,
    "group_desc": pl.Utf8,
    "group_ranks": pl.List(pl.Int64),
    "group_seq": pl.Int64,
    "group_source": pl.Utf8,
    "dim": pl.Utf8,
    "src": pl.Int32,
    "dst": pl.Int32,
    "call_id": pl.Utf8,
    "complete": pl.Boolean,
    "transfer_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "bus_factor": pl.Float64,
    "duration_s": pl.Float64,
}

P2P = ("send", "recv")
COLLECTIVE_COLUMNS = {
    "rank": pl.Int32,
    "seq": pl.Int32,
    "op": pl.Utf8,
    "bytes": pl.Int64,
    "wire_op": pl.Utf8,
    "wire_bytes": pl.Int64,
    "group": pl.Utf8,
    "group_size": pl.Int32,
    "peer": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "thread": pl.Utf8,
    "device": pl.Utf8,
    # the c10d call on the calling thread (CPU; null on GPU): what flight-recorder entries match
    "call_start_ns": pl.Int64,
    "call_end_ns": pl.Int64,
    # NCCL kernel name's algorithm and protocol (AllReduce_RING_LL -> RING, LL); null on gloo
    "algorithm": pl.Utf8,
    "protocol": pl.Utf8,
    "group_ranks_text": pl.Utf8,  # record_param_comms "Process Group Ranks" (GPU), JSON text
}
_KERNEL_ALGO = r"(?i)_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?:_|$)"


def bus_factor(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests bus-bandwidth factor for an op in a group of n ranks."""
    n = n.cast(pl.Float64)
    return (
        pl.when(op == "all_reduce")
        .then(2 * (n - 1) / n)
        .when(op.is_in(["all_gather", "reduce_scatter", "all_to_all"]))
        .then((n - 1) / n)
        .when(op == "barrier")
        .then(0.0)
        .otherwise(1.0)
    )


_SPAN_OP = {"reduce_scatter": "all_reduce"}  # what gloo really runs for a c10d op, where it differs
_PAIR_TOLERANCE_NS = 100_000


def _pair_rank(calls: list[dict], spans: list[dict]) -> list[int | None]:
    """For each span (in start order), the index of its call, or None.

    p2p runs on the calling thread, in order. Collectives run on the process group's own runloop
    threads, so spans of two groups can start out of their calls' order: a span takes, among
    the calls issued before it (and not yet taken), the first whose op gloo would run as the
    span's op, whose size (the span's, the call's or its flight-recorder entry's) agrees, and
    whose group is the one this runloop thread served before; failing those, the first one.
    """
    out: list[int | None] = []
    pending: list[int] = []
    nxt = 0
    thread_group: dict[str, str] = {}
    for span in spans:
        while nxt < len(calls) and calls[nxt]["start_ns"] <= span["start_ns"] + _PAIR_TOLERANCE_NS:
            pending.append(nxt)
            nxt += 1
        if not pending and nxt < len(calls):  # a span before any call: take the next call
            pending.append(nxt)
            nxt += 1
        if not pending:
            out.append(None)
            continue

        def cost(pos_i: tuple[int, int]) -> tuple[int, int]:
            pos, i = pos_i
            c = calls[i]
            bad = 0
            if _SPAN_OP.get(c["op"], c["op"]) != span["op"]:
                bad += 4
            sizes = {c.get("bytes"), c.get("fr_in_bytes"), c.get("fr_out_bytes")} - {None}
            if sizes and span.get("bytes") is not None and span["bytes"] not in sizes:
                bad += 2
            seen = thread_group.get(span["thread"])
            if seen is not None and c.get("fr_group") is not None and seen != c["fr_group"]:
                bad += 2
            return bad, pos

        best_pos, best = min(enumerate(pending), key=cost)
        pending.pop(best_pos)
        if calls[best].get("fr_group") is not None:
            thread_group.setdefault(span["thread"], calls[best]["fr_group"])
        out.append(best)
    return out


def _pair(calls: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Each span with its c10d call's op, bytes, peer, times and flight-recorder facts."""
    fr_cols = [
        c
        for c in ("fr_group", "fr_desc", "fr_seq", "fr_in_bytes", "fr_out_bytes", "fr_source")
        if c in calls.columns
    ]
    calls = calls.sort("rank", "start_ns").with_columns(
        pl.concat_str([pl.col("pid"), pl.col("tid")], separator="/").alias("thread")
    )
    spans = spans.sort("rank", "start_ns").with_columns(
        pl.concat_str([pl.col("pid"), pl.col("tid")], separator="/").alias("thread")
    )
    keep = ["rank", "p2p", "op", "bytes", "peer", "start_ns", "end_ns", *fr_cols]
    call_rows = calls.select(keep).to_dicts()
    span_rows = spans.select("rank", "p2p", "op", "bytes", "start_ns", "thread").to_dicts()
    by_key: dict[tuple, list[dict]] = {}
    for c in call_rows:
        by_key.setdefault((c["rank"], c["p2p"]), []).append(c)
    spans_by_key: dict[tuple, list[int]] = {}
    for k, sp in enumerate(span_rows):
        spans_by_key.setdefault((sp["rank"], sp["p2p"]), []).append(k)
    matched: list[dict | None] = [None] * len(span_rows)
    for key, idx in spans_by_key.items():
        cs = by_key.get(key, [])
        if key[1]:  # p2p: in order on the calling thread
            picks = [i if i < len(cs) else None for i in range(len(idx))]
        else:
            picks = _pair_rank(cs, [span_rows[k] for k in idx])
        for k, i in zip(idx, picks):
            matched[k] = cs[i] if i is not None else None
    schema = {
        "call_op": pl.Utf8,
        "call_bytes": pl.Int64,
        "call_peer": pl.Int32,
        "call_start_ns": pl.Int64,
        "call_end_ns": pl.Int64,
        "fr_group": pl.Utf8,
        "fr_desc": pl.Utf8,
        "fr_seq": pl.Int64,
        "fr_in_bytes": pl.Int64,
        "fr_out_bytes": pl.Int64,
        "fr_source": pl.Utf8,
    }
    cols: dict[str, list[Any]] = {name: [] for name in schema}
    src = {
        "call_op": "op",
        "call_bytes": "bytes",
        "call_peer": "peer",
        "call_start_ns": "start_ns",
        "call_end_ns": "end_ns",
    }
    for m in matched:
        for name in schema:
            cols[name].append(None if m is None else m.get(src.get(name, name)))
    return spans.hstack(pl.DataFrame(cols, schema=schema))


def cpu_collectives(
    events: pl.DataFrame, group_sizes: dict[int, int], sources: Any = None
) -> tuple[pl.DataFrame, list[str]]:
    """Collective instances of CPU ranks, one row per gloo span, with the op the program asked for
    and, where the run's flight-recorder dumps tell, its process group and sequence number."""
    from tracekit.analyses import groups

    warnings: list[str] = []
    comm = events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("kind") == "communication")
        & pl.col("op").is_not_null()
    )
    p2p = pl.col("op").is_in(P2P)
    calls = comm.filter(pl.col("cat") == "cpu_op").with_columns(p2p.alias("p2p"))
    spans = comm.filter(pl.col("cat") == "user_annotation").with_columns(p2p.alias("p2p"))
    if spans.height == 0:
        return pl.DataFrame(schema=COLLECTIVE_COLUMNS | groups.FR_COLUMNS), warnings
    n_calls = calls.group_by("rank", "p2p").len()
    n_spans = spans.group_by("rank", "p2p").len()
    mismatch = n_spans.join(n_calls, on=["rank", "p2p"], how="left").filter(
        pl.col("len") != pl.col("len_right").fill_null(0)
    )
    if mismatch.height:
        warnings.append(
            "collective calls and gloo spans differ in number on ranks "
            f"{sorted(set(mismatch['rank'].to_list()))}: sizes of unpaired spans come from the spans alone"
        )
    calls, fr_warnings = groups.attribute_calls(calls, sources)
    warnings += fr_warnings
    paired = _pair(calls, spans)
    sizes = pl.col("rank").replace_strict(group_sizes, default=None, return_dtype=pl.Int32)
    # a paired call whose op the span could have run (reduce_scatter -> gloo all_reduce) wins
    op = pl.coalesce("call_op", "op")
    return (
        paired.with_columns(
            op.alias("nominal_op"),
            pl.coalesce("call_bytes", "bytes").alias("nominal_bytes"),
            pl.coalesce("peer", "call_peer").alias("peer_"),
        ).select(
            "rank",
            pl.int_range(pl.len()).over("rank").cast(pl.Int32).alias("seq"),
            pl.col("nominal_op").alias("op"),
            pl.col("nominal_bytes").alias("bytes"),
            pl.col("op").alias("wire_op"),
            pl.col("bytes").alias("wire_bytes"),
            "group",
            pl.coalesce(pl.col("group_size"), sizes).alias("group_size"),
            pl.col("peer_").alias("peer"),
            "start_ns",
            "end_ns",
            "thread",
            "device",
            "call_start_ns",
            "call_end_ns",
            pl.lit(None, dtype=pl.Utf8).alias("algorithm"),
            pl.lit(None, dtype=pl.Utf8).alias("protocol"),
            pl.lit(None, dtype=pl.Utf8).alias("group_ranks_text"),
            "fr_group",
            "fr_desc",
            "fr_seq",
            "fr_in_bytes",
            "fr_out_bytes",
            "fr_source",
        ),
        warnings,
    )


def gpu_collectives(events: pl.DataFrame, group_sizes: dict[int, int]) -> pl.DataFrame:
    """Collective instances of GPU ranks: one row per nccl/rccl kernel."""
    k = events.filter((pl.col("device") == "gpu") & (pl.col("kind") == "communication"))
    sizes = pl.col("rank").replace_strict(group_sizes, default=None, return_dtype=pl.Int32)
    return k.sort("rank", "start_ns").select(
        "rank",
        pl.int_range(pl.len()).over("rank").cast(pl.Int32).alias("seq"),
        "op",
        "bytes",
        pl.col("op").alias("wire_op"),
        pl.col("bytes").alias("wire_bytes"),
        "group",
        pl.coalesce(pl.col("group_size"), sizes).alias("group_size"),
        "peer",
        "start_ns",
        "end_ns",
        pl.concat_str([pl.lit("stream"), pl.col("tid")], separator=" ").alias("thread"),
        "device",
        pl.lit(None, dtype=pl.Int64).alias("call_start_ns"),
        pl.lit(None, dtype=pl.Int64).alias("call_end_ns"),
        pl.col("name").str.extract(_KERNEL_ALGO, 1).str.to_uppercase().alias("algorithm"),
        pl.col("name").str.extract(_KERNEL_ALGO, 2).str.to_uppercase().alias("protocol"),
        pl.col("group_ranks").alias("group_ranks_text"),
    )


def raw_collectives(
    events: pl.DataFrame, group_sizes: dict[int, int], sources: Any = None
) -> tuple[pl.DataFrame, list[str]]:
    """Every collective instance of the trace (no window), with its process group, group
    sequence number and, where all members are present, transfer and wait time.

    ``sources`` (tracekit.analyses.groups.GroupSources) holds the flight-recorder dumps, run.json
    process groups and each trace's pg_config; None attributes from the traces alone.
    """
    from tracekit.analyses import groups, matching

    cpu, warnings = cpu_collectives(events, group_sizes, sources)
    table = pl.concat(
        [
            # polars#14468: cast() is typed to reject a dict[str, dtype] (it takes one at run time)
            cpu.cast(COLLECTIVE_COLUMNS | groups.FR_COLUMNS),  # type: ignore[arg-type]
            gpu_collectives(events, group_sizes).cast(COLLECTIVE_COLUMNS),  # type: ignore[arg-type]
        ],
        how="diagonal",
    )
    table, group_warnings = groups.attribute(table, sources)
    table, match_warnings = matching.match(table)
    table = table.with_columns(
        bus_factor(pl.col("op"), pl.col("group_size").fill_null(1)).alias("bus_factor"),
    )
    return table, warnings + group_warnings + match_warnings


def collectives_table(
    raw: tuple[pl.DataFrame, list[str]], windows: pl.DataFrame
) -> tuple[pl.DataFrame, list[str]]:
    """Every collective instance of ``raw`` (:func:`raw_collectives`: table, warnings) that
    starts inside its rank's window, with factor and duration."""
    table, warnings = raw
    table = (
        table.join(
            windows.select("rank", pl.col("start_ns").alias("w0"), pl.col("end_ns").alias("w1")),
            on="rank",
        )
        .filter((pl.col("start_ns") >= pl.col("w0")) & (pl.col("start_ns") < pl.col("w1")))
        .drop("w0", "w1")
        .with_columns(((pl.col("end_ns") - pl.col("start_ns")) * 1e-9).alias("duration_s"))
        .sort("rank", "start_ns")
    )
    return table, warnings
