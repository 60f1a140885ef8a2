"""When a point-to-point span on the host is communication (docs/metrics.md "Per rank").

A gloo ``gloo:send`` / ``gloo:recv`` span sits on the calling thread and lasts from ``isend`` /
``irecv`` to the ``wait()`` that sees it complete. Pipelines post receives ahead, so a span is
open almost all the time while the thread computes: the span is not the communication. Of a
p2p span, only two parts count as communication:

- transfer: while the bytes can move, i.e. after both ends have started. A receive's transfer is
  [max(its start, the matched send's start), its end] (the split the pipeline section makes:
  ``recv_transfer_s``); a send's is [max(its start, the matched receive's start), min(its end,
  the receive's end)] (once the receive has completed, the send's bytes have arrived).
- blocked wait: the tail of the span in which the calling thread ran no op, from the end of its
  last op that started before the span's end, to the span's end. gloo's wait leaves no event;
  the span ends when the wait returns, and a thread in ``wait()`` runs no op.

Sends and receives are matched as tracekit.analyses.matching pairs them (the k-th send a -> b
with the k-th receive on b from a). A span without its peer (the peer's trace is missing)
cannot be split: it counts whole, as before, and time in it not under a nested op is waiting.

Everything is sorts and as-of joins on sorted starts: linear in the events after the sort.
"""

from __future__ import annotations

import polars as pl

P2P_SPANS = ("gloo:send", "gloo:recv")
_EMPTY = {"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64}


def p2p_spans(cpu: pl.DataFrame) -> pl.Expr:
    """Filter for gloo p2p spans (apply to CPU events that carry a ``runloop`` column)."""
    return (
        (pl.col("cat") == "user_annotation")
        & (pl.col("kind") == "communication")
        & pl.col("name").is_in(P2P_SPANS)
        & ~pl.col("runloop")
    )


def matched(spans: pl.DataFrame, table: pl.DataFrame | None) -> pl.DataFrame:
    """The spans whose peer is known, with their transfer interval: rank, pid, tid, start_ns,
    end_ns, t0, t1 (t0 >= t1: no transfer inside the span)."""
    cols = ("op", "call_id", "rank", "start_ns", "end_ns", "device")
    if table is None or table.height == 0 or not set(cols) <= set(table.columns):
        return (
            spans.head(0)
            .select("rank", "pid", "tid", "start_ns", "end_ns")
            .with_columns(pl.lit(None, pl.Int64).alias("t0"), pl.lit(None, pl.Int64).alias("t1"))
        )
    p = table.filter(
        pl.col("op").is_in(["send", "recv"])
        & pl.col("call_id").is_not_null()
        & (pl.col("device") == "cpu")
    ).select(*cols[:4], "end_ns")
    send = p.filter(pl.col("op") == "send").unique("call_id", keep="first")
    recv = p.filter(pl.col("op") == "recv").unique("call_id", keep="first")
    pairs = send.select("call_id", pl.col("start_ns").alias("ss")).join(
        recv.select("call_id", pl.col("start_ns").alias("sr"), pl.col("end_ns").alias("er")),
        on="call_id",
    )
    rows = p.join(pairs, on="call_id").select(
        "rank",
        "start_ns",
        "end_ns",
        pl.when(pl.col("op") == "recv")
        .then(pl.max_horizontal("start_ns", "ss"))
        .otherwise(pl.max_horizontal("start_ns", "sr"))
        .alias("t0"),
        pl.when(pl.col("op") == "recv")
        .then(pl.col("end_ns"))
        .otherwise(pl.min_horizontal("end_ns", "er"))
        .alias("t1"),
    )
    return spans.select("rank", "pid", "tid", "start_ns", "end_ns").join(
        rows.unique(["rank", "start_ns", "end_ns"], keep="first"),
        on=["rank", "start_ns", "end_ns"],
    )


def blocked(spans: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each span's tail with no op on its thread: rank, start_ns, end_ns (empty ones dropped).

    The end of the last op before a time t is the running maximum of op ends, over ops sorted
    by start, at the last op starting before t: one as-of join, not a join of spans with ops.
    """
    if spans.height == 0:
        return pl.DataFrame(schema=_EMPTY)
    keys = ["rank", "pid", "tid"]
    reach = (
        ops.select(*keys, pl.col("start_ns").alias("o0"), pl.col("end_ns").alias("o1"))
        .sort(*keys, "o0")
        .with_columns(pl.col("o1").cum_max().over(keys).alias("reach"))
        .sort("o0")
    )
    tails = (
        spans.select(*keys, "start_ns", "end_ns")
        .sort("end_ns")
        .join_asof(
            reach.select(*keys, "o0", "reach"),
            left_on="end_ns",
            right_on="o0",
            by=keys,
            strategy="backward",
            allow_exact_matches=False,  # an op starting exactly at the end is after the wait
            check_sortedness=False,
        )
        .select(
            "rank",
            pl.max_horizontal("start_ns", pl.col("reach").fill_null(pl.col("start_ns"))).alias(
                "start_ns"
            ),
            "end_ns",
        )
    )
    return tails.filter(pl.col("end_ns") > pl.col("start_ns"))


def comm_parts(matched_spans: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Communication intervals of matched p2p spans: transfer and blocked wait (may overlap;
    the timeline's sweep takes their union)."""
    transfer = matched_spans.filter(pl.col("t1") > pl.col("t0")).select(
        "rank", pl.col("t0").alias("start_ns"), pl.col("t1").alias("end_ns")
    )
    # polars#14468: cast() is typed to reject a dict[str, dtype] (it takes one at run time)
    return pl.concat([transfer.cast(_EMPTY), blocked(matched_spans, ops).cast(_EMPTY)])  # type: ignore[arg-type]
