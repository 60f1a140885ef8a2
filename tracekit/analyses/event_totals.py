"""Time per event name: the report's and the app's "top events", as a per-rank map and a reduce.

Per rank (tracekit.analyses.rank_map): for every (name, kind, device) of its compute,
communication, memory and sync events (tracekit.events.WORK_KINDS), how many there are (``count``) and
their total duration in ns (``total_ns``, an integer sum). Across ranks: the sums of both, so
the table needs no rank's events again, and is exactly what one group_by over every event of
every rank gives (integer sums do not depend on their order).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.events import WORK_KINDS

SCHEMA = {
    "name": pl.Utf8,
    "kind": pl.Utf8,
    "device": pl.Utf8,
    "count": pl.Int64,
    "total_ns": pl.Int64,
}


def event_totals(events: pl.DataFrame) -> pl.DataFrame:
    """count and total_ns per (name, kind, device) of EVENTS (module docstring)."""
    return (
        events.lazy()
        .filter(pl.col("kind").is_in(list(WORK_KINDS)))
        .group_by("name", "kind", "device")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().cast(pl.Int64).alias("total_ns"),
        )
        .collect()
    )


def reduce_totals(parts: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Several ranks' :func:`event_totals` summed into one table of the same columns."""
    frames = [p.select(list(SCHEMA)).cast(SCHEMA) for p in parts if p.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=SCHEMA)
    return (
        pl.concat(frames)
        .group_by("name", "kind", "device")
        .agg(pl.col("count").sum(), pl.col("total_ns").sum())
    )
