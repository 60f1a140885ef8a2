"""Rank -> node: from --ranks-per-node, run.json, the run's NCCL logs, or each trace's host_name.

Sources, first that covers every rank wins: ``--ranks-per-node N`` (rank // N), run.json
``topology`` (what the launcher placed), the NCCL_DEBUG logs' rank layout (host and node of
every rank of the world communicator: tracekit.ingest.job.NcclLogs.layout), the traces'
``host_name`` (one node per distinct host, numbered in rank order). Unknown topology is one
node, with a warning that says how to give it. Nothing here reads a file: tracekit.ingest.load
hands over what was read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracekit.ingest.job import Topology

UNKNOWN = (
    "topology unknown: all ranks taken as one node; give it with --ranks-per-node N, "
    "a run.json topology, or traces carrying host_name"
)


def node_of_ranks(
    ranks: Sequence[int],
    run_nodes: Mapping[int, int] | None = None,
    ranks_per_node: int | None = None,
    hosts: Mapping[int, str | None] | None = None,
    layout: Mapping[int, Mapping[str, Any]] | None = None,
) -> Topology:
    """Each rank's node and where it came from. ``run_nodes``: run.json's rank -> node;
    ``hosts``: each trace's host_name; ``layout``: rank -> {node, ...} from the NCCL logs."""
    ranks = sorted(ranks)
    if ranks_per_node:
        return Topology({r: r // ranks_per_node for r in ranks}, "ranks_per_node")
    if run_nodes and all(r in run_nodes for r in ranks):
        return Topology({r: run_nodes[r] for r in ranks}, "run.json")
    if layout and all(r in layout and layout[r].get("node") is not None for r in ranks):
        return Topology({r: int(layout[r]["node"]) for r in ranks}, "nccl_log")
    hosts = hosts or {}
    if ranks and all(hosts.get(r) for r in ranks):
        order: dict[str, int] = {}
        for r in ranks:
            order.setdefault(str(hosts[r]), len(order))
        return Topology({r: order[str(hosts[r])] for r in ranks}, "host_name")
    return Topology({r: 0 for r in ranks}, "unknown", (UNKNOWN,) if len(ranks) > 1 else ())
