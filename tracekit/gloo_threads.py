"""gloo's runloop threads: where a CPU rank's collectives run, apart from its compute.

A thread is a runloop when its name says so (``pt_gloo_runloop``), or when it carries gloo
collective spans and no ``cpu_op`` (traces whose thread names are missing). Its spans are
communication; its events are never compute (tracekit.timeline).
"""

from __future__ import annotations

import polars as pl

RUNLOOP_THREAD = "pt_gloo_runloop"
#: a boolean column that stands for ``thread_name`` where only this was needed of it: the event
#: is on a CPU thread named as a runloop (tracekit.analyses.rank_map reads it so: the thread
#: names are a quarter of a rank's events table in memory)
NAMED_RUNLOOP = "named_runloop"
#: what names a thread
THREAD = ("rank", "pid", "tid")


def named_runloop() -> pl.Expr:
    """The event is on a CPU thread whose name says it is a gloo runloop."""
    named = pl.col("thread_name").fill_null("").str.contains(RUNLOOP_THREAD, literal=True)
    return (pl.col("device") == "cpu") & named


def runloop_threads(events: pl.DataFrame) -> pl.DataFrame:
    """(rank, pid, tid) of gloo runloop threads: named so, or carrying only gloo collective spans.
    ``events`` has ``thread_name``, or :data:`NAMED_RUNLOOP` in its place."""
    on_cpu = pl.col("device") == "cpu"
    named = events.filter(
        pl.col(NAMED_RUNLOOP) if NAMED_RUNLOOP in events.columns else named_runloop()
    )
    is_gloo_coll = pl.col("name").str.starts_with("gloo:") & ~pl.col("name").is_in(
        ["gloo:send", "gloo:recv"]
    )
    listed = on_cpu & pl.col("cat").is_in(["cpu_op", "user_annotation"])
    # the threads with a gloo collective span (few), then which of them also run ops: a group_by
    # or a filter of every event copied or hashed every row's text columns (#29)
    gloo = events.select(*THREAD, (listed & is_gloo_coll).alias("_k")).filter("_k")
    gloo = gloo.drop("_k").unique()
    if gloo.height == 0:
        unnamed = gloo
    else:
        theirs = member(THREAD, gloo)
        with_ops = events.select(
            *THREAD, (listed & (pl.col("cat") == "cpu_op") & theirs).alias("_k")
        ).filter("_k")
        unnamed = gloo.join(with_ops.drop("_k").unique(), on=list(THREAD), how="anti")
    return pl.concat([named.select(THREAD), unnamed.select(THREAD)]).unique()


def with_runloop(cpu: pl.DataFrame) -> pl.DataFrame:
    """``cpu`` with ``runloop``: the event is on a gloo runloop thread of its rank."""
    loops = runloop_threads(cpu)
    if loops.height == 0:  # NCCL traces have none: no pass over every CPU event for nothing
        return cpu.with_columns(pl.lit(False).alias("runloop"))
    # a flag, not a left join: the join copied every column of every row (#29)
    known = pl.all_horizontal(*(pl.col(k).is_not_null() for k in THREAD))  # as a join matches
    return cpu.with_columns((known & member(THREAD, loops)).fill_null(False).alias("runloop"))


#: up to this many threads, membership is tested key by key (a bit mask per thread); past it,
#: by struct (which encodes every row's keys: 160 MB at 5.4 M events)
FEW_THREADS = 64


def member(keys: tuple[str, ...], threads: pl.DataFrame) -> pl.Expr:
    """The row's ``keys`` are one of ``threads``' rows (null keys never are)."""
    if threads.height > FEW_THREADS:
        return pl.struct(*keys).is_in(threads.select(pl.struct(*keys)).to_series().implode())
    terms = [
        pl.all_horizontal(*(pl.col(k) == v for k, v in zip(keys, row, strict=True)))
        for row in threads.select(keys).iter_rows()
        if None not in row
    ]
    return pl.any_horizontal(terms).fill_null(False) if terms else pl.lit(False)
