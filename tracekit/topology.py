"""Rank -> node: from run.json, from --ranks-per-node, or from each trace's host_name.

Unknown topology is one node, with a warning that says how to give it.
"""
from __future__ import annotations

from typing import Any, Sequence


def node_of_ranks(
    ranks: Sequence[int],
    run: dict[str, Any] | None = None,
    ranks_per_node: int | None = None,
    hosts: dict[int, str | None] | None = None,
) -> tuple[dict[int, int], str, list[str]]:
    """(rank -> node, where it came from, warnings)."""
    ranks = sorted(ranks)
    if ranks_per_node:
        return {r: r // ranks_per_node for r in ranks}, "ranks_per_node", []
    topo = (run or {}).get("topology") or []
    if topo:
        nodes = {int(t["rank"]): int(t.get("node", 0)) for t in topo if "rank" in t}
        if all(r in nodes for r in ranks):
            return {r: nodes[r] for r in ranks}, "run.json", []
    hosts = hosts or {}
    if ranks and all(hosts.get(r) for r in ranks):
        order: dict[str, int] = {}
        for r in ranks:
            order.setdefault(str(hosts[r]), len(order))
        return {r: order[str(hosts[r])] for r in ranks}, "host_name", []
    warn = (
        "topology unknown: all ranks taken as one node; give it with --ranks-per-node N, "
        "a run.json topology, or traces carrying host_name"
    )
    return {r: 0 for r in ranks}, "unknown", ([warn] if len(ranks) > 1 else [])
