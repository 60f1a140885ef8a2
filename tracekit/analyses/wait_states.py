"""Wait states of every matched communication call (Scalasca's patterns, docs/metrics.md "Why").

A call's members arrive at different times; no data moves before the last one has arrived
(Scalasca: *Wait at N x N* for n-to-n collectives, *Late Broadcast* when the root of a 1-to-n
is late, *Early Reduce* when the root of an n-to-1 waits, *Late Sender* / *Late Receiver* for
point-to-point). So, per member rank r of a complete call (clocks aligned, tracekit.clock):

    arrival_r     = when its program made the call: the c10d call's start on CPU (gloo's span
                    starts when its runloop thread takes it up), else the span's start;
                    start_ns in the frame, the member's time counted from there
    last_arrival  = max over members of arrival;  last_rank = who arrived then
    wait_r        = clip(last_arrival - arrival_r, 0, end_r - arrival_r)   waiting for the last peer
    transfer      = max(0, min over members of end - last_arrival)  the bytes moving
    transfer_r    = min(transfer, end_r - max(arrival_r, last_arrival))
    tail_r        = end_r - arrival_r - wait_r - transfer_r   (a non-blocking span completed late)
    done_r        = arrival_r + wait_r + transfer_r     (when its bytes had moved)
    sync_r        = not p2p, or tail_r <= max(transfer, 50 us): the call held the rank

Per rank: waiting_s (its waits), caused_s (the waits of others whose last arrival it was), and
the breakdown with waiting as its own state: the timeline's exposed communication (state
``comm``) split into waiting (inside a wait interval) and transfer, so that
compute + transfer + waiting + other + idle = span. The matrix: waiter x last_rank, seconds.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyses import intervals as iv
from tracekit.analyses.section import SectionInput

P2P = ("send", "recv")
NXN = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")

#: the frame ``wait_states``: one row per member rank of each complete matched call
WAITS_SCHEMA = {
    "call_id": pl.Utf8,
    "op": pl.Utf8,
    "pattern": pl.Utf8,
    "rank": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "last_arrival_ns": pl.Int64,
    "last_rank": pl.Int32,
    "wait_ns": pl.Int64,
    "transfer_ns": pl.Int64,
    "tail_ns": pl.Int64,
    "done_ns": pl.Int64,
    "sync": pl.Boolean,
}

#: the frame ``rank_states``: the breakdown with waiting as its own state, per rank
STATES_SCHEMA = {
    "rank": pl.Int32,
    "span_s": pl.Float64,
    "compute_s": pl.Float64,
    "transfer_s": pl.Float64,
    "waiting_s": pl.Float64,
    "other_s": pl.Float64,
    "idle_s": pl.Float64,
    "overlap_s": pl.Float64,
    "comm_transfer_s": pl.Float64,
}

NS = 1e-9
#: a member leaving this long after the call's bytes moved still left with it (gloo ends differ)
SYNC_SLACK_NS = 50_000


def wait_rows(calls: pl.DataFrame) -> pl.DataFrame:
    """``wait_states``: per member of each complete call whose members are all in the window."""
    if calls.height == 0 or "call_id" not in calls.columns:
        return pl.DataFrame(schema=WAITS_SCHEMA)
    is_p2p = pl.col("op").is_in(P2P)
    posted = pl.min_horizontal(pl.col("call_start_ns").fill_null(pl.col("start_ns")), "start_ns")
    t = (
        calls.filter(pl.col("complete") & pl.col("call_id").is_not_null())
        .with_columns(
            posted.alias("_arr"),
            pl.when(is_p2p).then(2).otherwise(pl.col("group_size")).alias("_want"),
        )
        .with_columns(pl.len().over("call_id").alias("_n"))
        .filter(pl.col("_n") == pl.col("_want"))
    )
    # the last to arrive: the latest arrival, the lowest rank on a tie
    last = (
        t.sort("_arr", "rank", descending=[True, False])
        .group_by("call_id", maintain_order=True)
        .agg(
            pl.col("_arr").first().alias("last_arrival_ns"),
            pl.col("rank").first().alias("last_rank"),
            pl.col("end_ns").min().alias("_end"),
        )
        .with_columns(
            (pl.col("_end") - pl.col("last_arrival_ns")).clip(0).alias("_transfer"),
        )
    )
    dur = pl.col("end_ns") - pl.col("_arr")
    op = pl.col("op")
    pattern = (
        pl.when(op == "recv")
        .then(pl.lit("late_sender"))
        .when(op == "send")
        .then(pl.lit("late_receiver"))
        .when(op == "broadcast")
        .then(pl.lit("late_broadcast"))
        .when(op == "reduce")
        .then(pl.lit("early_reduce"))
        .when(op.is_in(NXN))
        .then(pl.lit("wait_at_nxn"))
        .otherwise(pl.lit("wait_at_collective"))
    )
    out = (
        t.join(last, on="call_id")
        .with_columns(
            (pl.col("last_arrival_ns") - pl.col("_arr")).clip(0).alias("_w"),
        )
        .with_columns(pl.min_horizontal("_w", dur).alias("wait_ns"))
        .with_columns(
            pl.min_horizontal(
                "_transfer",
                (pl.col("end_ns") - pl.max_horizontal("_arr", "last_arrival_ns")).clip(0),
            ).alias("transfer_ns")
        )
        .with_columns((dur - pl.col("wait_ns") - pl.col("transfer_ns")).alias("tail_ns"))
        .with_columns(
            (pl.col("_arr") + pl.col("wait_ns") + pl.col("transfer_ns")).alias("done_ns"),
            # a blocking call held the rank until its end; a p2p span that went on after its
            # bytes had moved (an isend completed by a later wait()) ended by the rank's own
            # program: not a synchronisation
            (
                ~is_p2p
                | (pl.col("tail_ns") <= pl.max_horizontal("_transfer", pl.lit(SYNC_SLACK_NS)))
            ).alias("sync"),
        )
        .select(
            "call_id",
            "op",
            pattern.alias("pattern"),
            "rank",
            pl.col("_arr").alias("start_ns"),
            "end_ns",
            "last_arrival_ns",
            "last_rank",
            "wait_ns",
            "transfer_ns",
            "tail_ns",
            "done_ns",
            "sync",
        )
    )
    return out.cast(WAITS_SCHEMA).sort("start_ns", "call_id", "rank")  # type: ignore[arg-type]


def wait_intervals(waits: pl.DataFrame, rank: int) -> tuple[iv.Ints, iv.Ints]:
    """A rank's time waiting on peers, as sorted disjoint intervals."""
    w = waits.filter((pl.col("rank") == rank) & (pl.col("wait_ns") > 0))
    s = w["start_ns"].to_numpy().astype(np.int64)
    return iv.union(s, s + w["wait_ns"].to_numpy().astype(np.int64))


def state_sets(
    seg: pl.DataFrame, waits: pl.DataFrame, rank: int
) -> dict[str, tuple[iv.Ints, iv.Ints]]:
    """A rank's timeline as disjoint sets per state with waiting split out of ``comm``:
    compute (compute and overlap), overlap, transfer, waiting, other, idle."""

    def of(*states: str) -> tuple[iv.Ints, iv.Ints]:
        p = seg.filter(pl.col("state").is_in(states))
        return iv.union(
            p["start_ns"].to_numpy().astype(np.int64), p["end_ns"].to_numpy().astype(np.int64)
        )

    comm = of("comm")
    waiting = iv.intersect(comm, wait_intervals(waits, rank))
    return {
        "compute": of("compute", "overlap"),
        "overlap": of("overlap"),
        "comm": comm,
        "waiting": waiting,
        "other": of("other"),
        "idle": of("idle"),
    }


def length(sets: tuple[iv.Ints, iv.Ints]) -> int:
    return int((sets[1] - sets[0]).sum())


def timelines(inp: SectionInput) -> dict[int, pl.DataFrame]:
    """rank -> its merged timeline segments (rank, start_ns, end_ns, state), sorted."""
    return {r: ref.read().sort("start_ns") for r, ref in inp.per_rank.timeline.items()}


def rank_states(
    segs: dict[int, pl.DataFrame], waits: pl.DataFrame, windows: pl.DataFrame
) -> tuple[pl.DataFrame, dict[int, dict[str, tuple[iv.Ints, iv.Ints]]]]:
    """``rank_states`` and each rank's state sets (:func:`state_sets`)."""
    rows, sets = [], {}
    spans = dict(zip(windows["rank"], windows["end_ns"] - windows["start_ns"], strict=True))
    for r, seg in segs.items():
        s = sets[r] = state_sets(seg, waits, r)
        waiting = length(s["waiting"])
        rows.append(
            {
                "rank": r,
                "span_s": spans.get(r, 0) * NS,
                "compute_s": length(s["compute"]) * NS,
                "transfer_s": (length(s["comm"]) - waiting) * NS,
                "waiting_s": waiting * NS,
                "other_s": length(s["other"]) * NS,
                "idle_s": length(s["idle"]) * NS,
                "overlap_s": length(s["overlap"]) * NS,
                "comm_transfer_s": (length(s["comm"]) + length(s["overlap"]) - waiting) * NS,
            }
        )
    return pl.DataFrame(rows, schema=STATES_SCHEMA), sets


def matrix(waits: pl.DataFrame) -> pl.DataFrame:
    """Who waits on whom: waiter, cause (the last to arrive), wait_ns, calls."""
    return (
        waits.filter((pl.col("wait_ns") > 0) & (pl.col("rank") != pl.col("last_rank")))
        .group_by(pl.col("rank").alias("waiter"), pl.col("last_rank").alias("cause"))
        .agg(pl.col("wait_ns").sum(), pl.len().alias("calls"))
        .sort("wait_ns", "waiter", "cause", descending=[True, False, False])
    )


def by_order(calls: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Calls no process group matched (call_id null: traces without groups nor flight records,
    as many foreign GPU traces), matched by order when every traced rank has the same sequence
    of them (same count, same op): the k-th of each is one call (``order#k``) of the traced
    ranks. A group larger than the traced ranks is analysed among those traced (a warning)."""
    if calls.height == 0 or "call_id" not in calls.columns:
        return calls, []
    loose = calls.filter(pl.col("call_id").is_null())
    if loose.height == 0 or calls.filter(pl.col("call_id").is_not_null()).height:
        return calls, []
    ranks = loose["rank"].unique().sort().to_list()
    seqs = {
        r: part.sort("start_ns")["op"].fill_null("?").to_list()
        for (r,), part in loose.partition_by("rank", as_dict=True).items()
    }
    first = seqs[ranks[0]]
    if len(ranks) < 2 or any(s != first for s in seqs.values()):
        return calls, []
    n = len(ranks)
    matched = loose.sort("rank", "start_ns").with_columns(
        pl.format("order#{}", pl.int_range(pl.len()).over("rank")).alias("call_id"),
        pl.lit(True).alias("complete"),
        pl.lit(n, pl.Int32).alias("group_size"),
    )
    warnings = [
        f"why: {len(first)} communication calls per rank carry no process group: matched by "
        f"order across the {n} traced ranks"
    ]
    sizes = loose["group_size"].drop_nulls().unique().to_list()
    if any(s > n for s in sizes):
        warnings.append(
            f"why: their group has {max(sizes)} ranks, {n} traced: waits among the traced ones "
            "(a wait on an untraced rank is not seen)"
        )
    return matched, warnings
