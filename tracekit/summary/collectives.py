"""summary.json ``collectives``, ``matching`` and ``volume``: the calls, their sizes and bandwidth.

S is a call's nominal size (nccl-tests): the all-gather output, the reduce-scatter input, the
tensor otherwise, barrier 0; n the group size; a row is one rank's part of one call.
"""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record

_TIME_BASIS = (
    "`transfer` (bandwidth from matched transfer times), `duration` (no complete call: span "
    "durations), or `mixed`"
)
_ALGBW = "algbw in GB/s: sum S / sum t, t the transfer time of complete calls, else the duration"
_BUSBW = "busbw in GB/s: sum (S x factor) / sum t (factor: all_reduce 2(n-1)/n; all_gather, "
_BUSBW += "reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send, recv 1)"


class CollectiveOp(Record):
    """Per op the program asked for, over every rank's rows; sorted by bytes, then op."""

    op: Annotated[
        str | None, M('the op (docs/labels.md "Op names"); null when the trace names none')
    ]
    count: Annotated[int, M("rows: calls x ranks")]
    bytes: Annotated[int | None, M("S summed over rows (= rank_bytes); null when no size is known")]
    rank_bytes: Annotated[int | None, M("S summed over rows: a call counts once per rank")]
    call_bytes: Annotated[
        int | None,
        M("S summed over calls (one member's view; a send and its recv count once each here)"),
    ]
    wire_bytes: Annotated[
        int | None,
        M("the size of the op the backend ran (`wire_op`), over rows; null when unknown"),
    ]
    unknown_size: Annotated[int, M("rows without a size")]
    calls: Annotated[int, M("matched calls")]
    complete_calls: Annotated[int, M("matched calls with every member rank present")]
    transfer_s: Annotated[
        float | None,
        M(
            "transfer time summed over every rank's rows of complete calls, seconds (transfer_s + "
            "wait_s = time_s of the matched rows); null without complete calls"
        ),
    ]
    wait_s: Annotated[
        float | None,
        M("wait (span minus transfer) summed the same way, seconds; null without complete calls"),
    ]
    time_s: Annotated[float, M("sum of the rows' durations, seconds")]
    algbw_gbps: Annotated[float | None, M(_ALGBW + "; null when no size or time is known")]
    busbw_gbps: Annotated[float | None, M(_BUSBW + "; null when algbw is")]
    time_basis: Annotated[
        str,
        M("`transfer` (complete calls: matched transfer times) or `duration` (span durations)"),
    ]


class CollectiveGroup(Record):
    """Per process group and op (point-to-point: per direction, op `send`), over its calls."""

    group: Annotated[str, M("the c10d group name; point-to-point `p2p a->b`")]
    label: Annotated[
        str,
        M(
            "the group named by parallel dimension and ranks (`shard {0,1}`, `replicate {0,2}`; "
            "without a dimension its description, `default_pg {0,1}`, else `group 3 {0,1}`; "
            "`p2p 0->1`): tracekit/analyses/group_names.py"
        ),
    ]
    desc: Annotated[str | None, M("the group's description (c10d `group_desc`); null when unknown")]
    dim: Annotated[
        str | None, M("its parallel dimension (`dp`, `tp`, `shard`, ...); null when unknown")
    ]
    ranks: Annotated[
        list[int | None], M("its member ranks in group order (null members when unknown)")
    ]
    group_size: Annotated[int | None, M("n, its number of ranks (2 for point-to-point)")]
    op: Annotated[str, M("the op")]
    count: Annotated[int, M("calls (not rank rows)")]
    complete_calls: Annotated[int, M("calls with every member rank present")]
    rank_rows: Annotated[int, M("rows of these calls over all ranks")]
    bytes: Annotated[
        int | None, M("S summed over calls (= call_bytes); null when no size is known")
    ]
    call_bytes: Annotated[int | None, M("S summed over calls; null when no size is known")]
    rank_bytes: Annotated[
        int | None, M("S summed over every rank's rows; null when no size is known")
    ]
    unknown_size: Annotated[int, M("calls without a size")]
    transfer_s: Annotated[
        float | None,
        M("transfer time over every rank's rows of complete calls, seconds; null without them"),
    ]
    wait_s: Annotated[
        float | None, M("wait time over the same rows, seconds; null without complete calls")
    ]
    time_s: Annotated[float, M("sum of every rank's row durations, seconds")]
    algbw_gbps: Annotated[
        float | None, M("algbw in GB/s: sum S / sum transfer time of complete calls; else null")
    ]
    busbw_gbps: Annotated[float | None, M(_BUSBW + "; null when algbw is")]
    time_basis: Annotated[str, M("`transfer` with a complete call, else `duration`")]


class Collectives(Record):
    """Totals over every rank's collective calls in the window (frame `collectives.parquet`,
    one row per call per rank); an input without any has zero counts and sizes and empty lists."""

    count: Annotated[int, M("rows: calls x ranks")]
    bytes: Annotated[int | None, M("= rank_bytes; null when no size is known")]
    rank_bytes: Annotated[
        int | None, M("S summed over all rows (every rank's): a call of n ranks counts n times")
    ]
    call_bytes: Annotated[
        int | None,
        M(
            "S summed over calls (a call counts once; a send and its recv are one transfer: once "
            "in the total, once in each of `per_op` send and recv)"
        ),
    ]
    unknown_size: Annotated[int, M("rows without a size")]
    bytes_counted: Annotated[dict[str, str], M("what each byte key counts, in words (key -> text)")]
    ideal_bytes_per_rank: Annotated[
        int | None,
        M(
            "sum of S x factor for the rank with the most: what an ideal ring sends per rank (the "
            'ZeRO paper\'s "communication volume"); null when no size is known',
            theory="ring_volume_per_rank",
        ),
    ]
    time_basis: Annotated[str, M(_TIME_BASIS)]
    calls: Annotated[int, M("matched calls")]
    complete_calls: Annotated[int, M("matched calls with every member rank present")]
    per_op: Annotated[list[CollectiveOp], M("per op, most bytes first")]
    per_group: Annotated[list[CollectiveGroup], M("per process group and op")]
    ideal_bytes_per_rank_per_step: Annotated[
        float | None,
        M("ideal_bytes_per_rank divided by the window's complete steps; null without steps"),
    ]


class Matching(Record):
    """How calls were attributed to process groups and matched across ranks (frame
    `collective_matches`); null without collective calls."""

    method: Annotated[str, M("the matching rule, in words")]
    calls: Annotated[int, M("matched calls")]
    complete_calls: Annotated[
        int, M("calls with exactly one row on every member rank, agreeing on op and size")
    ]
    unattributed_rows: Annotated[int, M("rows matched to no call (group or sequence unknown)")]
    group_sources: Annotated[
        dict[str, int],
        M(
            "rows per source of their process group: `flight_recorder`, `pg_config`, `trace`, "
            "`p2p`, `default`, `unmatched`, `unknown` (source -> rows)"
        ),
    ]


class VolumeOp(Record):
    """The busiest rank's bytes per step, per (op asked for, op run)."""

    op: Annotated[str | None, M("the op the program asked for")]
    wire_op: Annotated[str | None, M("the op the backend ran (gloo: reduce_scatter -> all_reduce)")]
    calls_per_step: Annotated[float, M("calls per complete step")]
    ideal_bytes_per_step: Annotated[
        float | None, M("S x factor of `op`, per step; null when no size is known")
    ]
    wire_bytes_per_step: Annotated[
        float | None, M("S x factor of `wire_op` with the size it ran, per step; null likewise")
    ]


class Volume(Record):
    """Bytes each rank sends per step, for the rank with the most ideal bytes; null without
    collective calls or complete steps. On gloo ZeRO-1/2 send 1.5x and ZeRO-3 2x what DP sends,
    because each reduce-scatter is a full all-reduce."""

    rank: Annotated[int, M("the busiest rank (ties: the lowest)")]
    steps: Annotated[int, M("the window's complete steps")]
    ideal_bytes_per_rank_per_step: Annotated[
        float | None,
        M(
            "S x factor of the op the program asked for, per step (DP, ZeRO-1/2: 2Psi(n-1)/n "
            "elements; ZeRO-3 3Psi(n-1)/n); null when no size is known",
            theory="ring_volume_per_rank",
        ),
    ]
    wire_bytes_per_rank_per_step: Annotated[
        float | None,
        M("the same with the op and size the backend ran; null when no size is known"),
    ]
    wire_to_ideal: Annotated[float | None, M("wire / ideal; null when either is unknown or 0")]
    per_op: Annotated[list[VolumeOp], M("the busiest rank's bytes per op, most ideal bytes first")]
