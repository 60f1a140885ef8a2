"""Per-rank time breakdown over the analysis window (docs/metrics.md "Per rank").

From the timeline's elementary segments:
- compute_s   = |compute|                       (state compute or overlap)
- comm_s      = |communication|                 (state overlap or comm)
- overlap_s   = |compute ∩ communication|       (state overlap)
- exposed_comm_s = comm_s - overlap_s           (state comm)
- other_s     = memcpy/memset/sync under neither (state other)
- idle_s      = span_s - everything above        (state idle)
so compute + exposed_comm + other + idle = span exactly (integer nanoseconds underneath).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import polars as pl

from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.summary.ranks import Rank

#: the frame ``ranks``: summary.json ``ranks[]`` as a table (tracekit.summary.ranks.Rank)
RANKS_SCHEMA = {
    "rank": pl.Int32,
    "node": pl.Int32,
    "span_s": pl.Float64,
    "step_time_s": pl.Float64,
    "compute_s": pl.Float64,
    "comm_s": pl.Float64,
    "overlap_s": pl.Float64,
    "exposed_comm_s": pl.Float64,
    "other_s": pl.Float64,
    "idle_s": pl.Float64,
    "window_kind": pl.Utf8,
    "window_steps": pl.Int32,
    "window_start_ns": pl.Int64,
    "window_end_ns": pl.Int64,
}

NS = 1e-9


def state_totals(seg: pl.DataFrame) -> pl.DataFrame:
    """Nanoseconds per rank and state: rank, compute, overlap, comm, other, idle (Int64)."""
    totals = (
        seg.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("ns"))
        .group_by("rank")
        .agg(
            [
                pl.col("ns").filter(pl.col("state") == s).sum().alias(s)
                for s in ("compute", "overlap", "comm", "other", "idle")
            ]
        )
    )
    return totals


def rank_breakdown(
    seg: pl.DataFrame, windows: pl.DataFrame, markers: pl.DataFrame, nodes: dict[int, int]
) -> pl.DataFrame:
    """One row per rank with the summary's ranks[] fields (seconds)."""
    totals = state_totals(seg)
    steps = (
        markers.join(windows.select("rank", "kind", "steps"), on="rank")
        .filter(pl.col("kind") == "complete_steps")
        .sort("rank", "start_ns")
        .with_columns(pl.int_range(pl.len()).over("rank").alias("i"))
        .filter(pl.col("i") < pl.col("steps"))
        .group_by("rank")
        .agg(((pl.col("end_ns") - pl.col("start_ns")).median() * NS).alias("step_time_s"))
    )
    out = (
        windows.select("rank", "kind", "steps", "start_ns", "end_ns")
        .join(totals, on="rank", how="left")
        .join(steps, on="rank", how="left")
        .with_columns(
            pl.col(c).fill_null(0) for c in ("compute", "overlap", "comm", "other", "idle")
        )
        .with_columns(
            ((pl.col("end_ns") - pl.col("start_ns")) * NS).alias("span_s"),
            ((pl.col("compute") + pl.col("overlap")) * NS).alias("compute_s"),
            ((pl.col("comm") + pl.col("overlap")) * NS).alias("comm_s"),
            (pl.col("overlap") * NS).alias("overlap_s"),
            (pl.col("comm") * NS).alias("exposed_comm_s"),
            (pl.col("other") * NS).alias("other_s"),
        )
        .with_columns(
            (
                pl.col("span_s")
                - pl.col("compute_s")
                - pl.col("exposed_comm_s")
                - pl.col("other_s")
            ).alias("idle_s"),
            pl.col("rank").replace_strict(nodes, default=0, return_dtype=pl.Int32).alias("node"),
        )
        .select(
            "rank",
            "node",
            "span_s",
            "step_time_s",
            "compute_s",
            "comm_s",
            "overlap_s",
            "exposed_comm_s",
            "other_s",
            "idle_s",
            pl.col("kind").alias("window_kind"),
            pl.col("steps").alias("window_steps"),
            pl.col("start_ns").alias("window_start_ns"),
            pl.col("end_ns").alias("window_end_ns"),
        )
        .sort("rank")
    )
    return out


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def ranks_section(inp: SectionInput) -> SectionResult[list[Rank]]:
    """summary.json ``ranks``: the breakdown's rows (a value that is not finite is null), and
    the frame ``ranks``."""
    table = inp.per_rank.breakdown  # rank_breakdown, computed per rank by the map
    rows = [{k: _finite(v) for k, v in row.items()} for row in table.to_dicts()]
    return SectionResult(msgspec.convert(rows, list[Rank], strict=True), {"ranks": table})
