"""Rank -> host, node and local rank from every source of placement an NCCL log holds.

Sources, for each rank, best first:

* ``init``: the world communicator's INIT line of that rank (``comm 0x.. rank 6 nRanks 16
  nNodes 2 localRanks 8 localRank 6``, or the older ``... - Init COMPLETE``): host from the
  line's prefix, localRank when logged;
* ``nccl-tests``: nccl-tests' header ``#  Rank  6 Group  0 Pid 1234 on host1 device  6 [..]``
  (rank 0 prints one for every rank of the job, so one file places the whole job);
* ``localRanks``: a rank neither shows, placed on node rank // localRanks, local rank
  rank % localRanks (contiguous placement, as torchrun, SLURM and mpirun --map-by node place).
  Only when the world communicator logs one localRanks and every rank seen agrees with it.

Nodes: rank // localRanks when localRanks is known and the seen ranks agree with it (each host
in one block of localRanks ranks, no block on two hosts), or when host names cannot tell nodes
apart (every node called "ubuntu"); otherwise one node per distinct host, numbered in order of
its lowest rank. Local rank: NCCL's localRank, else rank % localRanks (as above), else the
rank's position on its node when every rank is placed, else None.

Warnings say when the logs cover only part of the job (``NCCL logs cover 4 of 16 ranks
(nNodes 2, 1 seen): ranks 0-2,4,8-15 placed from localRanks only``), when the seen ranks do not
follow blocks of localRanks, and when host names cannot tell the nodes apart.
"""

from __future__ import annotations

from typing import Any, cast

import polars as pl

MAX_PLACED = 1 << 20  # ranks placed from localRanks at most (a damaged nranks can say 10^9)


def _gaps(seen: list[int], total: int) -> str:
    """The ranks 0..total-1 not in sorted ``seen``, as ranges ("0-2,4,8-15"), without listing
    them one by one (total comes from the log and can be huge)."""
    parts, at = [], 0
    for r in [*seen, total]:
        if r > at:
            parts.append(
                str(at) if r - at == 1 else f"{at},{at + 1}" if r - at == 2 else f"{at}-{r - 1}"
            )
        at = max(at, r + 1)
    return ",".join(parts)


def _ranks_in_lines(log: Any) -> int | None:
    """1 + the highest rank any ring, link, tree or transport line names (a lower bound on the
    job's size when no INIT line gives nranks)."""
    highest = -1
    for frame, cols in (
        (log.rings, ("order",)),
        (log.ring_links, ("rank", "prev", "next")),
        (log.trees, ("rank", "up")),
        (log.transports, ("src_rank", "dst_rank")),
    ):
        for c in cols:
            if frame.height and c in frame.columns:
                col = frame[c].explode() if c == "order" else frame[c]
                top = col.max()
                if top is not None:
                    highest = max(highest, int(top))
    return highest + 1 if highest >= 0 else None


def _seen(world: pl.DataFrame, placements: pl.DataFrame | None, n: int | None) -> dict:
    """rank -> {host, local_rank, source} from INIT lines and nccl-tests headers."""
    seen: dict[int, dict[str, Any]] = {}
    if placements is not None and placements.height:
        for r in (
            placements.sort("rank")
            .unique("rank", keep="first", maintain_order=True)
            .rows(named=True)
        ):
            if n is None or r["rank"] < n:
                seen[r["rank"]] = {"host": r["host"], "local_rank": None, "source": "nccl-tests"}
    for r in world.rows(named=True):
        header = seen.get(r["rank"], {})
        seen[r["rank"]] = {
            "host": r["host"] if r["host"] is not None else header.get("host"),
            "local_rank": r["local_rank"],
            "source": "init",
        }
    return seen


def derive(log: Any, world: pl.DataFrame) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """(rank -> {host, node, local_rank, source}, warnings) for the world communicator
    ``world`` (its INIT rows, one per rank; see the module docstring)."""
    n = int(cast(int, world["nranks"].max())) if world.height else None
    seen = _seen(world, log.placements, n)
    if not seen:
        return {}, []
    nnodes = cast("int | None", world["nnodes"].max()) if world.height else None
    per_node = world["local_ranks"].drop_nulls().unique().to_list() if world.height else []
    per = int(per_node[0]) if len(per_node) == 1 and per_node[0] > 0 else None
    hosts = {r: v["host"] for r, v in seen.items()}
    named = {h for h in hosts.values() if h is not None}
    warnings: list[str] = []

    blocks_ok = indistinct = False
    if per:
        block_of_host: dict[str, set[int]] = {}
        host_of_block: dict[int, set[str]] = {}
        for r, h in hosts.items():
            if h is not None:
                block_of_host.setdefault(h, set()).add(r // per)
                host_of_block.setdefault(r // per, set()).add(h)
        one_block_each = all(len(b) == 1 for b in block_of_host.values())
        distinct = all(len(h) == 1 for h in host_of_block.values())
        indistinct = len(named) < len(host_of_block)  # one name on several blocks
        blocks_ok = (one_block_each and distinct) or indistinct
        if indistinct:
            warnings.append(
                f"NCCL logs: host names do not tell the nodes apart ({len(named)} names for "
                f"{len(host_of_block)} blocks of localRanks {per}): node = rank // {per}"
            )
        elif not blocks_ok:
            warnings.append(
                f"NCCL logs: ranks are not placed in blocks of localRanks {per} (a host holds "
                "ranks of several blocks): nodes from host names, unseen ranks not placed"
            )

    layout: dict[int, dict[str, Any]] = {}
    node_of_host: dict[str | None, int] = {}
    for r in sorted(seen):
        v = seen[r]
        if blocks_ok:
            node, local = r // per, v["local_rank"] if v["local_rank"] is not None else r % per
        else:
            node = node_of_host.setdefault(v["host"], len(node_of_host)) if v["host"] else None
            local = v["local_rank"]
        layout[r] = {"host": v["host"], "node": node, "local_rank": local, "source": v["source"]}

    total = n if n is not None else max(_ranks_in_lines(log) or 0, max(layout) + 1)
    if total is not None and not blocks_ok and len(layout) == total:
        count: dict[Any, int] = {}
        for r in sorted(layout):  # position among its node's ranks, in rank order
            v = layout[r]
            if v["local_rank"] is None and v["node"] is not None:
                v["local_rank"] = count.get(v["node"], 0)
            count[v["node"]] = count.get(v["node"], 0) + 1
    seen_ranks = sorted(r for r in layout if total is None or r < total)
    n_missing = (total or 0) - len(seen_ranks)
    infer = blocks_ok and n is not None and n <= MAX_PLACED
    if infer:
        assert n is not None and per is not None  # infer implies both (blocks_ok needs per)
        missing = [r for r in range(n) if r not in layout]
        host_of = {r // per: v["host"] for r, v in layout.items() if v["host"]}
        for r in missing:
            layout[r] = {
                "host": None if indistinct else host_of.get(r // per),
                "node": r // per,
                "local_rank": r % per,
                "source": "localRanks",
            }
    if n_missing > 0:
        seen_nodes = len(named)
        plural = "s" if seen_nodes != 1 else ""
        nodes = (
            f"nNodes {nnodes}, {seen_nodes} seen" if nnodes else f"{seen_nodes} host{plural} seen"
        )
        size = f"{total}" if n is not None else f"at least {total}"
        how = f"placed from localRanks only (node = rank // {per})" if infer else "unknown"
        warnings.insert(
            0,
            f"NCCL logs cover {len(seen)} of {size} ranks ({nodes}): ranks "
            f"{_gaps(seen_ranks, total or 0)} {how}",
        )
    return dict(sorted(layout.items())), warnings
