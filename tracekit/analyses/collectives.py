"""Collective calls per rank, their sizes and bandwidth (nccl-tests definitions, DESIGN.md).

CPU/gloo traces show a collective twice: a short ``c10d::<op>`` call on the calling thread (the
op the program asked for, with its tensors) and a ``gloo:<op>`` span on a runloop thread (what
gloo really ran, and when). Nothing links the two but order, so on each rank the calls and the
spans are paired in issue order; gloo runs reduce-scatter as a full all-reduce, which this
pairing exposes (op reduce_scatter, wire_op all_reduce, wire_bytes the full input).
GPU/NCCL traces carry the collective on the kernel itself (record_param_comms args); kernels
without them keep the op their name tells and unknown bytes.

busbw factors (n = group size): all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
(n-1)/n; broadcast, reduce, send, recv 1. ``ideal_bytes_per_rank`` = sum of S x factor, the
ZeRO paper's per-rank communication volume under ideal ring algorithms.
"""
from __future__ import annotations

import polars as pl

P2P = ("send", "recv")
COLLECTIVE_COLUMNS = {
    "rank": pl.Int32, "seq": pl.Int32, "op": pl.Utf8, "bytes": pl.Int64, "wire_op": pl.Utf8,
    "wire_bytes": pl.Int64, "group": pl.Utf8, "group_size": pl.Int32, "peer": pl.Int32,
    "start_ns": pl.Int64, "end_ns": pl.Int64, "thread": pl.Utf8, "device": pl.Utf8,
}


def bus_factor(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests bus-bandwidth factor for an op in a group of n ranks."""
    n = n.cast(pl.Float64)
    return (
        pl.when(op == "all_reduce").then(2 * (n - 1) / n)
        .when(op.is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
        .when(op == "barrier").then(0.0)
        .otherwise(1.0)
    )


def _pair_in_order(calls: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Pair each rank's k-th call with its k-th span (per rank and p2p/collective class)."""
    idx = [pl.int_range(pl.len()).over("rank", "p2p").alias("k")]
    calls = calls.sort("rank", "start_ns").with_columns(*idx)
    spans = spans.sort("rank", "start_ns").with_columns(*idx)
    return spans.join(
        calls.select("rank", "p2p", "k", pl.col("op").alias("call_op"), pl.col("bytes").alias("call_bytes"),
                     pl.col("peer").alias("call_peer")),
        on=["rank", "p2p", "k"], how="left",
    )


def cpu_collectives(events: pl.DataFrame, group_sizes: dict[int, int]) -> tuple[pl.DataFrame, list[str]]:
    """Collective instances of CPU ranks, one row per gloo span, with the op the program asked for."""
    warnings: list[str] = []
    comm = events.filter((pl.col("device") == "cpu") & (pl.col("kind") == "communication") & pl.col("op").is_not_null())
    p2p = pl.col("op").is_in(P2P)
    calls = comm.filter(pl.col("cat") == "cpu_op").with_columns(p2p.alias("p2p"))
    spans = comm.filter(pl.col("cat") == "user_annotation").with_columns(p2p.alias("p2p"))
    if spans.height == 0:
        return pl.DataFrame(schema=COLLECTIVE_COLUMNS), warnings
    n_calls = calls.group_by("rank", "p2p").len()
    n_spans = spans.group_by("rank", "p2p").len()
    mismatch = n_spans.join(n_calls, on=["rank", "p2p"], how="left").filter(pl.col("len") != pl.col("len_right").fill_null(0))
    if mismatch.height:
        warnings.append(
            "collective calls and gloo spans differ in number on ranks "
            f"{sorted(set(mismatch['rank'].to_list()))}: sizes of unpaired spans come from the spans alone"
        )
    paired = _pair_in_order(calls, spans)
    sizes = pl.col("rank").replace_strict(group_sizes, default=None, return_dtype=pl.Int32)
    # a paired call whose op the span could have run (reduce_scatter -> gloo all_reduce) wins
    op = pl.coalesce("call_op", "op")
    return (
        paired.with_columns(
            op.alias("nominal_op"),
            pl.coalesce("call_bytes", "bytes").alias("nominal_bytes"),
            pl.coalesce("peer", "call_peer").alias("peer_"),
        )
        .select(
            "rank",
            pl.int_range(pl.len()).over("rank").cast(pl.Int32).alias("seq"),
            pl.col("nominal_op").alias("op"),
            pl.col("nominal_bytes").alias("bytes"),
            pl.col("op").alias("wire_op"),
            pl.col("bytes").alias("wire_bytes"),
            "group",
            pl.coalesce(pl.col("group_size"), sizes).alias("group_size"),
            pl.col("peer_").alias("peer"),
            "start_ns", "end_ns",
            pl.concat_str([pl.col("pid"), pl.col("tid")], separator="/").alias("thread"),
            "device",
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
        "op", "bytes",
        pl.col("op").alias("wire_op"),
        pl.col("bytes").alias("wire_bytes"),
        "group",
        pl.coalesce(pl.col("group_size"), sizes).alias("group_size"),
        "peer", "start_ns", "end_ns",
        pl.concat_str([pl.lit("stream"), pl.col("tid")], separator=" ").alias("thread"),
        "device",
    )


def collectives_table(
    events: pl.DataFrame, windows: pl.DataFrame, group_sizes: dict[int, int]
) -> tuple[pl.DataFrame, list[str]]:
    """Every collective instance that starts inside its rank's window, with factor and duration."""
    cpu, warnings = cpu_collectives(events, group_sizes)
    table = pl.concat([cpu.cast(COLLECTIVE_COLUMNS), gpu_collectives(events, group_sizes).cast(COLLECTIVE_COLUMNS)])
    table = (
        table.join(windows.select("rank", pl.col("start_ns").alias("w0"), pl.col("end_ns").alias("w1")), on="rank")
        .filter((pl.col("start_ns") >= pl.col("w0")) & (pl.col("start_ns") < pl.col("w1")))
        .drop("w0", "w1")
        .with_columns(
            ((pl.col("end_ns") - pl.col("start_ns")) * 1e-9).alias("duration_s"),
            bus_factor(pl.col("op"), pl.col("group_size").fill_null(1)).alias("bus_factor"),
        )
        .sort("rank", "start_ns")
    )
    return table, warnings


def collectives_summary(table: pl.DataFrame) -> dict:
    """summary.json ``collectives``: totals over all ranks' calls, per op, bandwidth by duration."""
    if table.height == 0:
        return {"count": 0, "bytes": 0, "ideal_bytes_per_rank": 0, "per_op": [], "per_group": [],
                "time_basis": "duration"}
    per_rank_ideal = table.group_by("rank").agg((pl.col("bytes").fill_null(0) * pl.col("bus_factor")).sum().alias("ideal"))
    per_op = (
        table.group_by("op")
        .agg(
            pl.len().alias("count"),
            pl.col("bytes").sum().alias("bytes"),
            pl.col("bytes").null_count().alias("unknown_size"),
            pl.col("duration_s").sum().alias("time_s"),
            pl.col("wire_bytes").sum().alias("wire_bytes"),
            pl.col("bus_factor").mean().alias("bus_factor"),
        )
        .with_columns(
            pl.when(pl.col("time_s") > 0).then(pl.col("bytes") / pl.col("time_s") / 1e9).alias("algbw_gbps"),
        )
        .with_columns((pl.col("algbw_gbps") * pl.col("bus_factor")).alias("busbw_gbps"))
        .sort("bytes", descending=True, nulls_last=True)
    )
    return {
        "count": table.height,
        "bytes": int(table["bytes"].fill_null(0).sum()),
        "ideal_bytes_per_rank": int(per_rank_ideal["ideal"].max() or 0),
        "time_basis": "duration",
        "per_op": [
            {
                "op": r["op"], "count": r["count"], "bytes": int(r["bytes"] or 0),
                "wire_bytes": int(r["wire_bytes"] or 0), "unknown_size": r["unknown_size"],
                "transfer_s": None, "wait_s": None, "time_s": r["time_s"],
                "algbw_gbps": r["algbw_gbps"], "busbw_gbps": r["busbw_gbps"],
            }
            for r in per_op.iter_rows(named=True)
        ],
        "per_group": [],
    }
