"""summary.json ``collectives`` (docs/metrics.md "Collectives"): totals, per op and per process
group, over the window's calls of the ``collectives`` frame (tracekit.analyses.collectives)."""

from __future__ import annotations

from typing import Any

import msgspec
import polars as pl

from tracekit.analyses.collectives import P2P
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.summary.collectives import Collectives

# What each byte figure of summary.json ``collectives`` counts (docs/metrics.md "Collectives").
COLLECTIVE_BYTES_COUNTED = {
    "bytes": "payload S of every rank's row, summed over ranks and calls (= rank_bytes; in "
    "per_group rows: = call_bytes)",
    "rank_bytes": "payload S of every rank's row, summed over ranks and calls: a call of n "
    "ranks counts n times",
    "call_bytes": "payload S per call, summed over calls (one member rank's view: a call "
    "counts once)",
    "wire_bytes": "payload of the op the backend ran (wire_op: gloo runs reduce_scatter as an "
    "all_reduce of the full input), summed over ranks and calls; not bytes on links (traffic)",
    "ideal_bytes_per_rank": "sum of S x bus factor over one rank's calls, the busiest rank: "
    "what an ideal ring sends per rank",
    "unknown": "a sum over calls whose sizes are all unknown is null; partly unknown sums "
    "count the known ones (unknown_size says how many are not)",
}


def _known_sum(expr: pl.Expr) -> pl.Expr:
    """Sum of the known values; null when none is known (polars would say 0)."""
    return pl.when(expr.count() > 0).then(expr.sum())


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


def collectives_summary(table: pl.DataFrame) -> dict:
    """summary.json ``collectives``: totals over all ranks' calls; per op and per process group,
    bandwidth from matched transfer times (tracekit.analyses.matching), else from durations."""
    from tracekit.analyses import matching

    if table.height == 0:  # the same keys, in the same order, as with calls
        return {
            "count": 0,
            "bytes": 0,
            "rank_bytes": 0,
            "call_bytes": 0,
            "unknown_size": 0,
            "bytes_counted": COLLECTIVE_BYTES_COUNTED,
            "ideal_bytes_per_rank": 0,
            "time_basis": "duration",
            "calls": 0,
            "complete_calls": 0,
            "per_op": [],
            "per_group": [],
        }
    has_match = "call_id" in table.columns
    if not has_match:  # a table built without matching: every row on its own
        table = table.with_columns(
            pl.lit(None, dtype=pl.Utf8).alias("call_id"),
            pl.lit(False).alias("complete"),
            pl.lit(None, dtype=pl.Int64).alias("transfer_ns"),
            pl.lit(None, dtype=pl.Int64).alias("wait_ns"),
        )
    # a barrier carries no payload: its size is 0, not unknown
    table = table.with_columns(
        pl.when(pl.col("op") == "barrier")
        .then(pl.col("bytes").fill_null(0))
        .otherwise(pl.col("bytes"))
        .alias("bytes")
    )
    per_rank_ideal = table.group_by("rank").agg(
        _known_sum(pl.col("bytes") * pl.col("bus_factor")).alias("ideal")
    )
    # one row per call for call_bytes: rows matched to one call_id count once (one member's
    # view), a row matched to no call counts on its own; per op, a p2p transfer counts once as
    # a send and once as a recv, in the total once
    calls_of = table.with_columns(
        pl.coalesce("call_id", pl.format("row:{}", pl.int_range(pl.len()))).alias("_call")
    )
    one_per_call = calls_of.unique("_call", keep="first", maintain_order=True)
    call_bytes = (
        calls_of.unique(["op", "_call"], keep="first", maintain_order=True)
        .group_by("op")
        .agg(_known_sum(pl.col("bytes")).alias("call_bytes"))
    )
    per_op = (
        table.group_by("op")
        .agg(
            pl.len().alias("count"),
            _known_sum(pl.col("bytes")).alias("bytes"),
            pl.col("bytes").null_count().alias("unknown_size"),
            pl.col("duration_s").sum().alias("time_s"),
            _known_sum(pl.col("wire_bytes")).alias("wire_bytes"),
            pl.col("bus_factor").mean().alias("bus_factor"),
            pl.col("call_id").drop_nulls().n_unique().alias("calls"),
            pl.col("call_id").filter(pl.col("complete")).n_unique().alias("complete_calls"),
            pl.col("transfer_ns").filter(pl.col("complete")).sum().alias("transfer_ns"),
            pl.col("wait_ns").filter(pl.col("complete")).sum().alias("wait_ns"),
        )
        .join(call_bytes, on="op", how="left", nulls_equal=True)
        .with_columns(
            pl.when(pl.col("time_s") > 0)
            .then(pl.col("bytes") / pl.col("time_s") / 1e9)  # null bytes: null, never 0
            .alias("algbw_gbps"),
        )
        .with_columns((pl.col("algbw_gbps") * pl.col("bus_factor")).alias("busbw_gbps"))
        # ties (and unknown sizes, last) by op name: the same order on every run
        .sort(["bytes", "op"], descending=[True, False], nulls_last=True)
    )
    # one row per call for the transfer-based bandwidth (p2p: send and recv are one transfer)
    calls = (
        matching.calls_frame(table.filter(~pl.col("op").is_in(P2P))).to_dicts() if has_match else []
    )
    p2p_calls = (
        matching.calls_frame(table.filter(pl.col("op").is_in(P2P))).to_dicts() if has_match else []
    )
    rows = []
    for r in per_op.iter_rows(named=True):
        op_calls = p2p_calls if r["op"] in P2P else [c for c in calls if c["op"] == r["op"]]
        algbw, busbw = matching.bandwidth(op_calls)
        transfer = r["complete_calls"] > 0
        rows.append(
            {
                "op": r["op"],
                "count": r["count"],
                "bytes": _int(r["bytes"]),
                "rank_bytes": _int(r["bytes"]),
                "call_bytes": _int(r["call_bytes"]),
                "wire_bytes": _int(r["wire_bytes"]),
                "unknown_size": r["unknown_size"],
                "calls": r["calls"],
                "complete_calls": r["complete_calls"],
                "transfer_s": r["transfer_ns"] * 1e-9 if transfer else None,
                "wait_s": r["wait_ns"] * 1e-9 if transfer else None,
                "time_s": r["time_s"],
                "algbw_gbps": algbw if transfer else r["algbw_gbps"],
                "busbw_gbps": busbw if transfer else r["busbw_gbps"],
                "time_basis": "transfer" if transfer else "duration",
            }
        )
    bases = {r["time_basis"] for r in rows}
    total = table.select(
        _known_sum(pl.col("bytes")).alias("rank"), pl.col("bytes").null_count().alias("unknown")
    ).row(0, named=True)
    return {
        "count": table.height,
        "bytes": _int(total["rank"]),
        "rank_bytes": _int(total["rank"]),
        "call_bytes": _int(one_per_call.select(_known_sum(pl.col("bytes"))).item()),
        "unknown_size": int(total["unknown"]),
        "bytes_counted": COLLECTIVE_BYTES_COUNTED,
        "ideal_bytes_per_rank": _int(per_rank_ideal["ideal"].max()),
        "time_basis": bases.pop() if len(bases) == 1 else "mixed",
        "calls": int(table["call_id"].drop_nulls().n_unique()),
        "complete_calls": int(table.filter(pl.col("complete"))["call_id"].n_unique()),
        "per_op": rows,
        "per_group": matching.per_group(table) if has_match else [],
    }


def collectives_section(inp: SectionInput) -> SectionResult[Collectives]:
    """summary.json ``collectives``: :func:`collectives_summary` of the window's calls, with the
    busiest rank's ideal bytes per complete step; the frame ``collectives`` (the calls)."""
    summary = collectives_summary(inp.collectives)
    ideal, steps = summary["ideal_bytes_per_rank"], inp.steps
    per_step = ideal / steps if steps and ideal is not None else None
    value = {**summary, "ideal_bytes_per_rank_per_step": per_step}
    frames = {"collectives": inp.collectives}
    return SectionResult(msgspec.convert(value, Collectives, strict=True), frames)
