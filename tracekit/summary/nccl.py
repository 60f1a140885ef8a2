"""summary.json ``nccl``: what the run's NCCL logs say beside what the traced kernels ran
(docs/nccl.md)."""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record


class NcclPlacement(Record):
    """Where the logs place one rank (tracekit/ingest/nccl_placement.py)."""

    host: Annotated[str | None, M("its host; null when the logs do not tell nodes apart by name")]
    node: Annotated[int | None, M("its node; null when the logs cannot place it")]
    local_rank: Annotated[int | None, M("its rank inside the node; null when unknown")]
    source: Annotated[
        str, M("`init` (its INIT line), `nccl-tests` (a rank header) or `localRanks`")
    ]


class NcclAlgorithm(Record):
    """An algorithm and protocol the TUNING lines chose, per op, over a range of sizes."""

    op: Annotated[str | None, M("the op")]
    algo: Annotated[str | None, M("the algorithm (`RING`, `TREE`, ...)")]
    proto: Annotated[str | None, M("the protocol (`LL`, `LL128`, `SIMPLE`)")]
    min_bytes: Annotated[int, M("smallest size it was chosen for")]
    max_bytes: Annotated[int, M("largest size it was chosen for")]
    lines: Annotated[int, M("TUNING lines")]


class NcclLogs(Record):
    """The run's NCCL logs (`<run>/nccl/*.log`)."""

    files: Annotated[int, M("log files read")]
    version: Annotated[str | None, M("NCCL's version; null when no banner was logged")]
    communicators: Annotated[int, M("distinct communicators")]
    layout: Annotated[dict[str, NcclPlacement], M("rank -> where the logs place it")]
    nodes: Annotated[int | None, M("distinct nodes of the layout; null without one")]
    ring_order: Annotated[
        list[int] | None, M("ring 0's rank order; null when no complete ring 0 is logged")
    ]
    algorithms: Annotated[list[NcclAlgorithm], M("the TUNING lines' choices")]
    warnings: Annotated[
        list[str], M("what the logs leave out: ranks not covered, lines cut off mid-text")
    ]


class Nccl(Record):
    """What the run's NCCL logs say beside what the traced kernels ran; null without logs and
    without NCCL kernels."""

    kernel_algorithms: Annotated[
        dict[str, dict[str, int]],
        M("op -> `<ALGO>_<PROTO>` -> kernels, from the traced kernel names"),
    ]
    logs: Annotated[NcclLogs | None, M("what the logs say; null without logs")]
