"""Cross-rank matching of collectives: transfer time versus synchronisation wait.

A collective is one call made by every rank of its process group. The k-th call of group G on
each member rank is the same call (``group_seq``: the flight recorder's collective_seq_id, or the
per-group order; see tracekit.analyses.groups). Each rank's span of it starts when that rank
arrives and ends when the data has moved, so a rank that arrives early waits for the last one:

    transfer = min over member ranks of the span duration        (the last to arrive waits least)
    wait_r   = duration_r - transfer                             (synchronisation wait on rank r)

(torch-tb-profiler's "transfer vs synchronizing" split.) A call is ``complete`` when every member
rank has exactly one row for it and they agree on the op and, where known, the size; otherwise
its rows keep only their durations (transfer_ns and wait_ns null). Point-to-point transfers are
matched by direction and order: the k-th send from a to b is the k-th recv on b from a
(``call_id`` ``p2p:a->b#k``), transfer = the two spans' overlap, from the later start to the
earlier end (a receive posted ahead waits for its send: Scalasca's late sender; the breakdown's
p2p rule, tracekit.p2p_time, is the same), wait = the rest of each span; the order is shifted when
the trace of b starts with a recv whose send predates a's trace (``best_shift``).

Bandwidth (nccl-tests, docs/metrics.md) uses one transfer time per call: algbw = S / transfer, busbw =
algbw x factor(op, n). Summed over calls: algbw = sum S / sum transfer, busbw = sum S x factor /
sum transfer. transfer_s and wait_s in the summaries are sums over every rank's rows, so that
transfer_s + wait_s = time_s of the matched rows.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit.analyses.group_names import group_label

P2P = ("send", "recv")
MATCH_COLUMNS = {
    "call_id": pl.Utf8,
    "complete": pl.Boolean,
    "transfer_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "src": pl.Int32,
    "dst": pl.Int32,
}
MATCHES_SCHEMA = {
    "group": pl.Utf8,
    "seq": pl.Int64,
    "op": pl.Utf8,
    "bytes": pl.Int64,
    "rank": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "transfer_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "complete": pl.Boolean,
    "group_size": pl.Int32,
    "dim": pl.Utf8,
    "call_id": pl.Utf8,
}


def _keys(table: pl.DataFrame) -> pl.DataFrame:
    """call_id and the ranks that must take part, for every row that can be matched."""
    is_p2p = pl.col("op").is_in(P2P)
    src = (
        pl.when(pl.col("op") == "send")
        .then(pl.col("rank"))
        .otherwise(pl.col("peer"))
        .cast(pl.Int32)
    )
    dst = (
        pl.when(pl.col("op") == "send")
        .then(pl.col("peer"))
        .otherwise(pl.col("rank"))
        .cast(pl.Int32)
    )
    t = table.with_columns(
        pl.when(is_p2p).then(src).alias("src"),
        pl.when(is_p2p).then(dst).alias("dst"),
    )
    t = t.with_row_index("_row")
    p2p_index = _p2p_index(t.filter(is_p2p & pl.col("peer").is_not_null()))
    t = t.join(p2p_index, on="_row", how="left").drop("_row")
    k = pl.col("_k")
    return t.with_columns(
        pl.when(is_p2p & pl.col("peer").is_not_null())
        .then(pl.format("p2p:{}->{}#{}", "src", "dst", k))
        .when(~is_p2p & pl.col("group").is_not_null() & pl.col("group_seq").is_not_null())
        .then(pl.format("{}#{}", "group", "group_seq"))
        .alias("call_id"),
        pl.when(is_p2p)
        .then(pl.concat_list(pl.col("src").cast(pl.Int64), pl.col("dst").cast(pl.Int64)))
        .otherwise(pl.col("group_ranks"))
        .alias("_expected"),
    ).drop("_k")


def best_shift(sends: list[tuple[int, int]], recvs: list[tuple[int, int]]) -> int:
    """recv j pairs with send j + shift: the shift with the fewest impossible pairs (a recv that
    ends before its send starts), then the most pairs, then the smallest |shift|. A trace window
    can start with a recv whose send came before the sender's window (asynchronous pipelines
    keep messages in flight across step boundaries): then the shift is -1, not 0."""
    best: tuple[int, int, int] | None = None
    shift_of_best = 0
    for shift in range(-len(recvs) + 1, len(sends)):
        pairs = [(sends[j + shift], r) for j, r in enumerate(recvs) if 0 <= j + shift < len(sends)]
        bad = sum(1 for (s0, _), (_, r1) in pairs if r1 < s0)
        key = (bad, -len(pairs), abs(shift))
        if best is None or key < best:
            best, shift_of_best = key, shift
    return shift_of_best


def _p2p_index(p2p: pl.DataFrame) -> pl.DataFrame:
    """_row -> _k: the transfer index of each send/recv within its direction (src, dst)."""
    rows: list[tuple[int, int]] = []
    for _, part in p2p.group_by("src", "dst"):
        sends = part.filter(pl.col("op") == "send").sort("start_ns")
        recvs = part.filter(pl.col("op") == "recv").sort("start_ns")
        # a send is posted when its c10d call starts (isend: the span may come later, at wait)
        posted = sends.select(
            pl.min_horizontal(pl.col("call_start_ns").fill_null(pl.col("start_ns")), "start_ns")
        )[:, 0]
        shift = best_shift(
            list(zip(posted, sends["end_ns"])), list(zip(recvs["start_ns"], recvs["end_ns"]))
        )
        rows += [(r, i) for i, r in enumerate(sends["_row"].to_list())]
        rows += [(r, j + shift) for j, r in enumerate(recvs["_row"].to_list())]
    return pl.DataFrame(rows, schema={"_row": pl.UInt32, "_k": pl.Int64}, orient="row")


def match(table: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Add call_id, complete, transfer_ns, wait_ns (and src, dst for p2p) to a collectives table."""
    warnings: list[str] = []
    if table.height == 0:
        return table.with_columns(
            *[pl.lit(None, dtype=t).alias(c) for c, t in MATCH_COLUMNS.items()]
        ), warnings
    t = _keys(table).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_dur"))
    calls = (
        t.filter(pl.col("call_id").is_not_null())
        .group_by("call_id")
        .agg(
            pl.len().alias("_n"),
            pl.col("rank").n_unique().alias("_n_ranks"),
            pl.col("rank").cast(pl.Int64).sort().alias("_present"),
            pl.col("_expected").first().list.sort().alias("_want"),
            pl.when(pl.col("op").is_in(P2P))
            .then(pl.lit("p2p"))
            .otherwise(pl.col("op"))
            .n_unique()
            .alias("_ops"),
            pl.col("bytes").drop_nulls().n_unique().alias("_sizes"),
            pl.col("_dur").min().alias("_shortest"),
            (pl.col("end_ns").min() - pl.col("start_ns").max()).clip(0).alias("_overlap"),
            pl.col("op").is_in(P2P).all().alias("_p2p"),
        )
        .with_columns(
            # p2p: the two spans' overlap, from the later start (the other side already there)
            # to the earlier end; a receive posted ahead is waiting, not moving bytes
            pl.when(pl.col("_p2p"))
            .then(pl.col("_overlap"))
            .otherwise(pl.col("_shortest"))
            .alias("_transfer")
        )
        .with_columns(
            (
                (pl.col("_ops") == 1)
                & (pl.col("_sizes") <= 1)
                & (pl.col("_n") == pl.col("_n_ranks"))
            ).alias("_consistent"),
        )
        .with_columns(
            (
                pl.col("_consistent")
                & pl.col("_want").is_not_null()
                & (pl.col("_present") == pl.col("_want"))
            ).alias("complete"),
        )
    )
    bad = calls.filter(~pl.col("_consistent")).height
    if bad:
        warnings.append(
            f"{bad} collective calls matched across ranks disagree in op or size, or repeat on a rank "
            "(desynchronised ranks, or groups guessed without flight-recorder dumps): duration only"
        )
    t = (
        t.join(calls.select("call_id", "complete", "_transfer"), on="call_id", how="left")
        .with_columns(
            pl.col("complete").fill_null(False),
        )
        .with_columns(
            pl.when(pl.col("complete")).then(pl.col("_transfer")).alias("transfer_ns"),
        )
        .with_columns(
            (pl.col("_dur") - pl.col("transfer_ns")).alias("wait_ns"),
        )
    )
    return t.drop("_expected", "_dur", "_transfer").cast(
        {k: v for k, v in MATCH_COLUMNS.items()}
    ), warnings


def matches_frame(table: pl.DataFrame) -> pl.DataFrame:
    """``collective_matches``: one row per rank per matched call (group, seq, op, bytes, rank,
    start_ns, end_ns, transfer_ns, wait_ns, complete, group_size, dim, call_id)."""
    if table.height == 0 or "call_id" not in table.columns:
        return pl.DataFrame(schema=MATCHES_SCHEMA)
    m = table.filter(pl.col("call_id").is_not_null())
    is_p2p = pl.col("op").is_in(P2P)
    return (
        m.select(
            pl.when(is_p2p)
            .then(pl.format("p2p {}->{}", "src", "dst"))
            .otherwise(pl.col("group"))
            .alias("group"),
            pl.when(is_p2p)
            .then(pl.col("call_id").str.extract(r"#(\d+)$", 1).cast(pl.Int64))
            .otherwise(pl.col("group_seq"))
            .alias("seq"),
            "op",
            "bytes",
            "rank",
            "start_ns",
            "end_ns",
            "transfer_ns",
            "wait_ns",
            "complete",
            pl.when(is_p2p).then(pl.lit(2)).otherwise(pl.col("group_size")).alias("group_size"),
            "dim",
            "call_id",
        )
        .cast(MATCHES_SCHEMA)  # type: ignore[arg-type]  # polars#14468: cast() rejects a dict[str, dtype]
        .sort("group", "seq", "rank", "start_ns", "call_id", nulls_last=True, maintain_order=True)
    )


def calls_frame(table: pl.DataFrame) -> pl.DataFrame:
    """One row per call (not per rank): call_id, group, group_desc, dim, seq, op, bytes, ranks
    (group order), group_size, src, dst, algorithm, protocol, device, complete, transfer_ns,
    start_ns, end_ns, present (ranks seen)."""
    t = table.filter(pl.col("call_id").is_not_null())
    is_send = pl.col("op") == "send"
    # rows in a defined order, so that each call's first() is the same row on every run
    return (
        t.sort("rank", "start_ns", maintain_order=True)
        .group_by("call_id", maintain_order=True)
        .agg(
            pl.col("group").first(),
            pl.col("group_desc").first(),
            pl.col("dim").first(),
            pl.col("group_seq").first().alias("seq"),
            # a p2p transfer is named by its send side when that is traced
            pl.col("op").sort_by(~is_send).first().alias("op"),
            pl.col("bytes").max(),
            pl.col("group_ranks").first().list.sort().alias("ranks"),
            pl.col("group_size").max(),
            pl.col("src").first(),
            pl.col("dst").first(),
            pl.col("algorithm").drop_nulls().first(),
            pl.col("protocol").drop_nulls().first(),
            pl.col("device").first(),
            pl.col("complete").first(),
            pl.col("transfer_ns").first(),
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.col("rank").n_unique().alias("present"),
        )
        .with_columns(
            pl.when(pl.col("op") == "recv").then(pl.lit("send")).otherwise(pl.col("op")).alias("op")
        )
        .sort("start_ns", "call_id")
    )


def _bus_factor(op: str | None, n: int | None) -> float:
    n = n or 1
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 0.0 if op == "barrier" else 1.0


def bandwidth(calls: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s over complete calls: sum S / sum transfer (nccl-tests factors)."""
    done = [
        c
        for c in calls
        if c.get("complete") and c.get("transfer_ns") and c.get("bytes") is not None
    ]
    t = sum(c["transfer_ns"] for c in done) * 1e-9
    if not done or t <= 0:
        return None, None
    s = sum(c["bytes"] for c in done)
    sf = sum(c["bytes"] * _bus_factor(c["op"], c.get("group_size")) for c in done)
    return s / t / 1e9, sf / t / 1e9


def per_group(table: pl.DataFrame) -> list[dict[str, Any]]:
    """``collectives.per_group``: one row per (group, op) with count (calls, not rank rows),
    bytes (S summed over calls), transfer_s and wait_s (over every rank's rows), algbw, busbw."""
    if table.height == 0 or "call_id" not in table.columns:
        return []
    calls = calls_frame(table)
    is_p2p = pl.col("op").is_in(P2P)
    calls = calls.with_columns(
        pl.when(is_p2p)
        .then(pl.format("p2p {}->{}", "src", "dst"))
        .otherwise(pl.col("group"))
        .alias("gkey")
    )
    rows_t = (
        table.filter(pl.col("call_id").is_not_null())
        .join(calls.select("call_id", "gkey"), on="call_id")
        .with_columns(pl.when(is_p2p).then(pl.lit("send")).otherwise(pl.col("op")).alias("op"))
        .group_by("gkey", "op")
        .agg(
            pl.len().alias("rank_rows"),
            pl.col("transfer_ns").filter(pl.col("complete")).sum().alias("transfer_ns"),
            pl.col("wait_ns").filter(pl.col("complete")).sum().alias("wait_ns"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("time_ns"),
            # payload of every rank's row (null when no size is known)
            pl.when(pl.col("bytes").count() > 0).then(pl.col("bytes").sum()).alias("rank_bytes"),
        )
    )
    out = []
    for (gkey, op), part in calls.group_by("gkey", "op", maintain_order=True):
        dicts = part.to_dicts()
        first = dicts[0]
        algbw, busbw = bandwidth(dicts)
        agg = rows_t.filter((pl.col("gkey") == gkey) & (pl.col("op") == op)).to_dicts()[0]
        complete = sum(1 for c in dicts if c["complete"])
        sizes = [c["bytes"] for c in dicts if c["bytes"] is not None]
        ranks = first["ranks"] if first["ranks"] is not None else [first["src"], first["dst"]]
        out.append(
            {
                "group": gkey,
                "label": group_label(gkey, first["group_desc"], first["dim"], ranks),
                "desc": first["group_desc"],
                "dim": first["dim"],
                "ranks": ranks,
                "group_size": first["group_size"] if op not in P2P else 2,
                "op": op,
                "count": len(dicts),
                "complete_calls": complete,
                "rank_rows": agg["rank_rows"],
                # S per call summed over calls (null when no size is known)
                "bytes": int(sum(sizes)) if sizes else None,
                "call_bytes": int(sum(sizes)) if sizes else None,
                "rank_bytes": None if agg["rank_bytes"] is None else int(agg["rank_bytes"]),
                "unknown_size": sum(1 for c in dicts if c["bytes"] is None),
                "transfer_s": agg["transfer_ns"] * 1e-9 if complete else None,
                "wait_s": agg["wait_ns"] * 1e-9 if complete else None,
                "time_s": agg["time_ns"] * 1e-9,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "time_basis": "transfer" if complete else "duration",
            }
        )
    out.sort(key=lambda r: (str(r["group"]), str(r["op"])))
    return out
