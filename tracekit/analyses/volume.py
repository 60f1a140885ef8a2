"""summary.json ``volume``: bytes each rank sends per step, ideal (the ZeRO paper's) and real.

``ideal``: every call's nominal size S (all-gather output, reduce-scatter input, the tensor
otherwise) times the nccl-tests bus factor of its op: what an ideal ring sends per rank, the ZeRO
paper's "communication volume" (DP and ZeRO-1/2: 2 Psi (n-1)/n per step; ZeRO-3 3 Psi (n-1)/n).
``wire``: the same with the op and size the backend really ran (collectives' ``wire_op``,
``wire_bytes``): gloo has no reduce-scatter and runs a full all-reduce of the input, which sends
2 S (n-1)/n instead of S (n-1)/n, so ZeRO-2/3 and FSDP on gloo send more than the paper counts.
Per rank, divided by the window's complete steps, for the rank with the most ideal bytes (as
``collectives`` ``ideal_bytes_per_rank``, which is that maximum); ``per_op[]`` splits both, for
that rank, by the op the program asked for and the op the backend ran.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.collectives import bus_factor
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.summary.collectives import Volume, VolumeOp


def volume_summary(coll: pl.DataFrame, steps: int) -> Volume | None:
    """summary.json ``volume`` of the calls over ``steps`` steps, or None without either."""
    if coll.height == 0 or steps <= 0:
        return None
    n = pl.col("group_size").fill_null(1)
    rows = coll.with_columns(
        (pl.col("bytes").fill_null(0) * bus_factor(pl.col("op"), n)).alias("ideal"),
        # a span without sizes (gloo all_gather when groups differ in size) moved S all the same:
        # the all-gather output, or the full input a reduce-scatter all-reduces
        (
            pl.coalesce("wire_bytes", "bytes").fill_null(0)
            * bus_factor(pl.col("wire_op").fill_null(pl.col("op")), n)
        ).alias("wire"),
    )
    per_rank = rows.group_by("rank").agg(pl.col("ideal").sum(), pl.col("wire").sum())
    # ties: the lowest rank, and ops by name, so that every run writes the same summary
    busiest = int(per_rank.sort(["ideal", "rank"], descending=[True, False])["rank"][0])
    per_op = (
        rows.filter(pl.col("rank") == busiest)
        .group_by("op", "wire_op")
        .agg(pl.len().alias("count"), pl.col("ideal").sum(), pl.col("wire").sum())
        .sort(["ideal", "op", "wire_op"], descending=[True, False, False], nulls_last=True)
    )
    top = per_rank.filter(pl.col("rank") == busiest).row(0, named=True)
    ideal, wire = float(top["ideal"]) / steps, float(top["wire"]) / steps
    # no call's size known (HTA traces without record_param_comms sizes): unknown, not 0
    known = bool(coll["bytes"].is_not_null().any() or coll["wire_bytes"].is_not_null().any())
    if not known:
        ideal = wire = None  # type: ignore[assignment]
    return Volume(
        rank=busiest,
        steps=steps,
        ideal_bytes_per_rank_per_step=ideal,
        wire_bytes_per_rank_per_step=wire,
        wire_to_ideal=wire / ideal if ideal and wire is not None else None,
        per_op=[
            VolumeOp(
                op=r["op"],
                wire_op=r["wire_op"],
                calls_per_step=r["count"] / steps,
                ideal_bytes_per_step=r["ideal"] / steps if known else None,
                wire_bytes_per_step=r["wire"] / steps if known else None,
            )
            for r in per_op.iter_rows(named=True)
        ],
    )


def volume(inp: SectionInput) -> SectionResult[Volume]:
    """The ``volume`` section."""
    return SectionResult(volume_summary(inp.collectives, inp.steps))
