"""summary.json ``topology``, ``clock`` and ``traffic``: nodes, one clock, bytes on rank -> rank
links (docs/traffic.md tells how each is found).

Every ``bytes``, ``intra`` and ``inter`` of ``traffic`` is bytes on the wire: what the call's
algorithm puts on each directed link, summed over all links and calls of the window.
"""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record

_INTRA = "wire bytes on links inside one node"
_INTER = "wire bytes on links between nodes"


class Topology(Record):
    """Which node each rank is on, and where that came from."""

    source: Annotated[
        str,
        M(
            "`ranks_per_node`, `run.json`, `nccl_log`, `host_name`, or `unknown` (all ranks on "
            "node 0, with a warning)"
        ),
    ]
    nodes: Annotated[dict[str, int], M("rank -> node")]


class Clock(Record, omit_defaults=True):
    """Clock alignment of traces from several hosts (tracekit/clock.py); null with fewer than two
    ranks."""

    method: Annotated[str, M("how offsets are estimated, in words")]
    reference_rank: Annotated[int | None, M("the rank whose clock the others are put on")]
    offsets_ns: Annotated[
        dict[str, int],
        M(
            "rank -> its clock's offset from the reference rank's, ns (subtracted from its times when applied)"
        ),
    ]
    residual_ns: Annotated[
        dict[str, int | None],
        M("rank -> median |end difference| left after the offset (the jitter), ns; null if none"),
    ]
    calls: Annotated[dict[str, int], M("rank -> matched calls shared with the reference rank")]
    per_host: Annotated[dict[str, int], M("host -> its one offset, ns")]
    applied: Annotated[bool, M("whether the times were moved")]
    reason: Annotated[
        str | None,
        M(
            "why not applied, or not for every rank (e.g. ranks that share no matched call); absent when none"
        ),
    ] = None


class TrafficOp(Record):
    """Per op, most bytes first."""

    op: Annotated[str, M("the op")]
    intra: Annotated[int, M(_INTRA)]
    inter: Annotated[int, M(_INTER)]
    bytes: Annotated[int, M("wire bytes on all links (intra + inter + unclassified)")]
    payload_bytes: Annotated[
        int | None,
        M("S per call summed over calls (`collectives` `call_bytes`); bytes = payload x factor"),
    ]


class TrafficGroup(Record):
    """Per process group and op."""

    group: Annotated[str, M("the c10d group name; point-to-point `p2p a->b`")]
    op: Annotated[str, M("the op")]
    intra: Annotated[int, M(_INTRA)]
    inter: Annotated[int, M(_INTER)]
    bytes: Annotated[int, M("wire bytes on all links")]
    desc: Annotated[str | None, M("the group's description; null when unknown")]
    dim: Annotated[str | None, M("its parallel dimension; null when unknown")]
    ranks: Annotated[list[int], M("its member ranks (point-to-point: src, dst)")]
    label: Annotated[str, M("the group named by dimension and ranks, e.g. `shard {0,1}`")]
    payload_bytes: Annotated[int | None, M("S per call summed over calls; null when unknown")]


class TrafficDim(Record):
    """Per parallel dimension (run.json names the dims)."""

    dim: Annotated[str, M("the dimension (`tp`, `dp`, `shard`, ...)")]
    intra: Annotated[int, M(_INTRA)]
    inter: Annotated[int, M(_INTER)]
    bytes: Annotated[int, M("wire bytes on all links")]


class TrafficDimPerStep(Record):
    """`by_dim[]` divided by the window's complete steps."""

    dim: Annotated[str, M("the dimension")]
    intra: Annotated[float, M(_INTRA + ", per step")]
    inter: Annotated[float, M(_INTER + ", per step")]
    bytes: Annotated[float, M("wire bytes on all links, per step")]


class TrafficPerStep(Record):
    """The window's totals divided by its complete steps."""

    steps: Annotated[int, M("the window's complete steps")]
    intra_node_bytes: Annotated[float, M(_INTRA + ", per step")]
    inter_node_bytes: Annotated[float, M(_INTER + ", per step")]
    total_bytes: Annotated[float, M("all wire bytes, per step")]
    by_dim: Annotated[list[TrafficDimPerStep], M("per parallel dimension, per step")]


class Traffic(Record):
    """Bytes on rank -> rank links, each matched call once (not per rank) by the algorithm its
    backend runs (frame `traffic_links`: src, dst, bytes, intra); null without matched calls."""

    model: Annotated[dict[str, str], M("op -> the link model applied to it, in words")]
    intra_node_bytes: Annotated[int | None, M(_INTRA + "; null when no call's size is known")]
    inter_node_bytes: Annotated[int | None, M(_INTER + "; null likewise")]
    unclassified_bytes: Annotated[
        int | None, M("wire bytes on links touching a rank with no node (a warning); null likewise")
    ]
    total_bytes: Annotated[int | None, M("intra + inter + unclassified; null likewise")]
    inter_node_fraction: Annotated[
        float | None, M("inter / (intra + inter), from exact sums; null likewise")
    ]
    by_op: Annotated[list[TrafficOp], M("per op")]
    by_group: Annotated[list[TrafficGroup], M("per process group and op")]
    matrix: Annotated[
        list[list[int]] | None,
        M(
            "`matrix[i][j]`: wire bytes from rank `matrix_ranks[i]` to `matrix_ranks[j]`; null "
            "past 1024 ranks, with a warning (the `traffic_links` frame has every link)"
        ),
    ]
    matrix_ranks: Annotated[
        list[int],
        M(
            "the ranks with traces and the ranks at a link's end, never the declared world size "
            "(every rank 0..n-1 traced: `matrix[src][dst]` indexes by rank)"
        ),
    ]
    bytes_counted: Annotated[dict[str, str], M("what each byte key counts, in words")]
    by_dim: Annotated[list[TrafficDim], M("per parallel dimension ([] when run.json names none)")]
    per_step: Annotated[
        TrafficPerStep | None, M("totals per complete step; null without steps or sizes")
    ]
    calls: Annotated[int, M("calls modelled: matched calls with known members, and p2p")]
    unknown_size_calls: Annotated[int, M("of them, calls without a size (no bytes on the links)")]
    nodes: Annotated[int, M("distinct nodes of the ranks")]
    backend: Annotated[str, M("the backends modelled, `+`-joined (`gloo`, `nccl`, `gloo+nccl`)")]
    ring_source: Annotated[
        str, M("ring order: `nccl_log` (ring 0 from the run's NCCL logs) or `group order`")
    ]
