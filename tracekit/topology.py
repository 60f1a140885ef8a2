"""Rank -> node: from --ranks-per-node, run.json, the run's NCCL logs, or each trace's host_name.

Sources, first that covers every rank wins: ``--ranks-per-node N`` (rank // N), run.json
``topology`` (what the launcher placed), the NCCL_DEBUG logs' rank layout (host and node of
every rank of the world communicator, tracekit.ingest.nccl_log.rank_layout), the traces'
``host_name`` (one node per distinct host, numbered in rank order). Unknown topology is one
node, with a warning that says how to give it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def node_of_ranks(
    ranks: Sequence[int],
    run: dict[str, Any] | None = None,
    ranks_per_node: int | None = None,
    hosts: dict[int, str | None] | None = None,
    layout: dict[int, dict[str, Any]] | None = None,
) -> tuple[dict[int, int], str, list[str]]:
    """(rank -> node, where it came from, warnings). ``layout``: rank -> {node, ...} from NCCL logs."""
    ranks = sorted(ranks)
    if ranks_per_node:
        return {r: r // ranks_per_node for r in ranks}, "ranks_per_node", []
    topo = (run or {}).get("topology") or []
    if topo:
        nodes = {int(t["rank"]): int(t.get("node", 0)) for t in topo if "rank" in t}
        if all(r in nodes for r in ranks):
            return {r: nodes[r] for r in ranks}, "run.json", []
    if layout and all(r in layout and layout[r].get("node") is not None for r in ranks):
        return {r: int(layout[r]["node"]) for r in ranks}, "nccl_log", []
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


def run_nccl_logs(path: Any) -> Any:
    """The NCCL_DEBUG logs in <run>/nccl/ (tracekit.ingest.nccl_log.NcclLog), or None without any."""
    from pathlib import Path

    from tracekit import runfolder
    from tracekit.errors import TracekitError
    from tracekit.ingest.nccl_log import read_nccl_logs

    folder = runfolder.nccl_dir(Path(path)) if Path(path).is_dir() else None
    if (
        folder is None
        or not folder.is_dir()
        or not any(p.name.endswith((".log", ".log.gz", ".txt")) for p in folder.iterdir())
    ):
        return None
    try:
        return read_nccl_logs(folder)
    except TracekitError:
        return None


def nccl_layout(path: Any) -> dict[int, dict[str, Any]] | None:
    """rank -> {host, node, local_rank, source} from the NCCL logs in <run>/nccl/, or None
    without logs: tracekit.ingest.nccl_log.rank_layout of those logs (the one derivation: INIT
    lines, nccl-tests headers, and localRanks for the ranks the logs do not show)."""
    from tracekit.ingest.nccl_log import rank_layout

    log = run_nccl_logs(path)
    if log is None:
        return None
    return rank_layout(log) or None
