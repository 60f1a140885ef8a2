"""Who and where each rank is: host, node, local rank, CPU threads; run.json ``topology``.

    me = describe_rank(rank)                     # on every rank, then gathered on all
    rows, source, notes = topology(everyone)     # run.json topology, and why nodes are what they are
    oversubscription(everyone)                   # one warning per host with more threads than CPUs

The node comes from the launcher when it says (torchrun ``GROUP_RANK``, Slurm ``SLURM_NODEID``),
else from the host names; the local rank from ``LOCAL_RANK`` / ``SLURM_LOCALID``, else the order
on the host. Used by the user-facing profiler (tracekit.capture.profiler).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

# launcher variables, most specific first: (node id, local rank)
_NODE_VARS = ("GROUP_RANK", "SLURM_NODEID")
_LOCAL_VARS = ("LOCAL_RANK", "SLURM_LOCALID")


def _env_int(names: tuple[str, ...]) -> tuple[int | None, str | None]:
    for name in names:
        value = os.environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value), name
    return None, None


def launcher() -> str:
    if "TORCHELASTIC_RUN_ID" in os.environ or "GROUP_RANK" in os.environ:
        return "torchrun"
    if "SLURM_PROCID" in os.environ:
        return "slurm"
    return "none"


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def nccl_log_path() -> str | None:
    """This process's NCCL_DEBUG_FILE with NCCL's %h (short host name) and %p (pid) expanded."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    host = socket.gethostname().split(".")[0]
    return pattern.replace("%h", host).replace("%p", str(os.getpid()))


def describe_rank(rank: int) -> dict[str, Any]:
    node, node_var = _env_int(_NODE_VARS)
    local, local_var = _env_int(_LOCAL_VARS)
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node_env": node,
        "node_var": node_var,
        "local_env": local,
        "local_var": local_var,
        "threads": torch.get_num_threads(),
        "cpus": _cpus(),
    }


def topology(everyone: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, list[str]]:
    """run.json topology from what every rank said about itself: (rows, source, warnings).

    Node: the launcher's node id when every rank has one from the same variable and no node id
    spans two hosts; else the order in which hosts first appear by rank. Local rank: the
    launcher's, else the rank's position among the ranks of its host.
    """
    everyone = sorted(everyone, key=lambda m: m["rank"])
    notes: list[str] = []
    hosts_of: dict[int, set[str]] = {}
    for m in everyone:
        if m["node_env"] is not None:
            hosts_of.setdefault(m["node_env"], set()).add(m["host"])
    node_vars = {m["node_var"] for m in everyone}
    source = "host_name"
    if len(node_vars) == 1 and None not in node_vars:
        split = sorted(n for n, h in hosts_of.items() if len(h) > 1)
        if split:
            notes.append(
                f"{node_vars.pop()} puts several hosts on node(s) {split}; nodes taken "
                "from the host names instead"
            )
        else:
            source = node_vars.pop()
    order: dict[str, int] = {}
    seen_on_host: dict[str, int] = {}
    rows = []
    for m in everyone:
        node = m["node_env"] if source != "host_name" else order.setdefault(m["host"], len(order))
        position = seen_on_host.get(m["host"], 0)
        seen_on_host[m["host"]] = position + 1
        local = m["local_env"] if m["local_env"] is not None else position
        rows.append({"rank": m["rank"], "node": node, "host": m["host"], "local_rank": local})
    return rows, source, notes


def oversubscription(everyone: list[dict[str, Any]]) -> list[str]:
    """One warning per host whose ranks run more threads than the CPUs they may use."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for m in everyone:
        by_host.setdefault(m["host"], []).append(m)
    out = []
    for host, ranks in sorted(by_host.items()):
        threads = sum(m["threads"] for m in ranks)
        cpus = len(set().union(*(m["cpus"] for m in ranks)))
        if threads > cpus:
            per_rank = sorted({m["threads"] for m in ranks})
            fair = max(1, cpus // len(ranks))
            out.append(
                f"host {host}: {len(ranks)} ranks x {'/'.join(map(str, per_rank))} threads "
                f"= {threads} threads on {cpus} CPUs: the ranks oversubscribe the CPUs and "
                f"timings suffer; call torch.set_num_threads({fair}) in each rank (or set "
                f"OMP_NUM_THREADS={fair})"
            )
    return out
