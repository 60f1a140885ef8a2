"""Which bytes cross which link: each collective put on rank -> rank links by its real algorithm.

One call of nominal size S (the all-gather output, the reduce-scatter input, the tensor
otherwise) among the n ranks of a process group puts these bytes on directed links. "Ring
successor" follows the group order, or the NCCL ring order when the log gave one.

    all_reduce, ring        reduce-scatter then all-gather: each rank sends 2(n-1)/n x S to its
                            ring successor (n links)
    all_gather, ring        each rank sends (n-1)/n x S to its successor
    reduce_scatter, NCCL    ring: each rank sends (n-1)/n x S to its successor
    reduce_scatter, gloo    gloo has no native reduce-scatter: torch runs a full all_reduce of
                            the input, so 2(n-1)/n x S per rank, twice the nominal volume
    broadcast, gloo         binomial tree from the root: in round k (k = 0 .. ceil(log2 n)-1)
                            every rank that has the data, at distance d < 2^k from the root in
                            group order, sends S to distance d + 2^k: n-1 edges, S each
    reduce, gloo            the mirror: the same tree, each edge child -> parent, S each
    broadcast, NCCL         a chain along the ring: root -> successor -> ... : n-1 links, S each
    reduce, NCCL            a chain along the ring ending at the root: root's successor -> ...
                            -> root: n-1 links, S each (data still moves in ring direction)
    all_reduce, NCCL tree   simplified double binary tree: one tree, reduce up and broadcast
                            down, each tree edge carries S in each direction. The tree is NCCL's
                            shape: a chain inside each node (in ring order) and a binary tree of
                            the nodes' first ranks across nodes. NCCL really splits S in halves
                            over two complementary trees; per link class the bytes are the same,
                            2(n-1) x S in all, which equals the ring's n x 2(n-1)/n x S.
    all_to_all              direct pairs: each rank sends S/n to every other rank
    send / recv             S on its one link src -> dst (one row per transfer, not one per end)
    barrier                 no bytes

NCCL uses the tree for all_reduce only; any other op named with TREE falls back to the ring.
A link is intra-node when both ends are on one node, inter-node otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import polars as pl

from tracekit.ingest.foreign import ranges
from tracekit.labels import COMM_OPS

LINK_SCHEMA = {"call_index": pl.Int64, "src": pl.Int64, "dst": pl.Int64, "bytes": pl.Float64}

Link = tuple[int, int, float]

# What each (backend, op, algorithm) does, for summary.json's traffic.model.
_MODEL = {
    "ring_all_reduce": "ring: each rank sends 2(n-1)/n x S to its ring successor",
    "ring_all_gather": "ring: each rank sends (n-1)/n x S to its ring successor",
    "ring_reduce_scatter": "ring: each rank sends (n-1)/n x S to its ring successor",
    "gloo_reduce_scatter": "a full all_reduce of the input (gloo has no native reduce-scatter): "
    "ring, each rank sends 2(n-1)/n x S to its successor",
    "binomial_broadcast": "binomial tree from the root: n-1 edges, S each",
    "binomial_reduce": "binomial tree into the root (broadcast's mirror): n-1 edges, S each",
    "chain_broadcast": "ring chain root -> successor -> ...: n-1 links, S each",
    "chain_reduce": "ring chain ending at the root: n-1 links, S each",
    "tree_all_reduce": "tree (simplified double binary tree: chain inside nodes, binary tree "
    "across nodes): S up and S down each tree edge",
    "direct_all_to_all": "direct pairs: each rank sends S/n to every other rank",
    "p2p": "one link src -> dst, S",
    "barrier": "no bytes",
}


def _ring(ranks: list[int], ring: Sequence[int] | None) -> list[int]:
    """Ring order: NCCL's when given (global ranks, or comm ranks 0..n-1), else group order."""
    if not ring:
        return ranks
    ring = [int(r) for r in ring]
    if sorted(ring) == sorted(ranks):
        return ring
    if sorted(ring) == list(range(len(ranks))):  # NCCL logs print ranks inside the communicator
        return [ranks[r] for r in ring]
    raise ValueError(f"ring order {ring} is not a permutation of the group {ranks}")


def _ring_links(order: list[int], per_rank: float) -> list[Link]:
    n = len(order)
    return [(order[i], order[(i + 1) % n], per_rank) for i in range(n)] if n > 1 else []


def _binomial_edges(ranks: list[int], root: int) -> list[tuple[int, int]]:
    """(parent, child) edges of the binomial broadcast tree rooted at `root`, in group order."""
    n, at = len(ranks), ranks.index(root)
    edges, mask = [], 1
    while mask < n:
        for d in range(mask):  # ranks at distance < mask have the data; each sends mask further
            if d + mask < n:
                edges.append((ranks[(at + d) % n], ranks[(at + d + mask) % n]))
        mask <<= 1
    return edges


def _chain_from(order: list[int], root: int) -> list[int]:
    """The ring rotated to start at the root."""
    at = order.index(root)
    return order[at:] + order[:at]


def _tree_edges(order: list[int], node_of: dict[int, int] | None) -> list[tuple[int, int]]:
    """NCCL-shaped tree: a chain inside each node, a binary tree of node leaders across nodes."""
    nodes: dict[int, list[int]] = {}
    for r in order:  # nodes in order of first appearance; ranks in ring order inside each
        nodes.setdefault((node_of or {}).get(r, 0), []).append(r)
    chains = list(nodes.values())
    edges = [(c[i], c[i + 1]) for c in chains for i in range(len(c) - 1)]
    edges += [(chains[(i - 1) // 2][0], chains[i][0]) for i in range(1, len(chains))]
    return edges


def _root(call: dict[str, Any], ranks: list[int]) -> int:
    root = call.get("root")
    root = ranks[0] if root is None else int(root)  # torch's usual src=0 when the log has none
    if root not in ranks:
        raise ValueError(f"root {root} is not in the group {ranks}")
    return root


def _kind(call: dict[str, Any]) -> str:
    """The _MODEL key of the algorithm this call runs."""
    op, backend = call["op"], str(call.get("backend") or "").lower()
    if op not in COMM_OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(COMM_OPS)}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {call.get('backend')!r}; expected 'gloo' or 'nccl'")
    algorithm = str(call.get("algorithm") or "ring").lower()
    if op in ("send", "recv"):
        return "p2p"
    if op == "barrier":
        return "barrier"
    if op == "all_to_all":
        return "direct_all_to_all"
    if backend == "gloo":
        return {
            "reduce_scatter": "gloo_reduce_scatter",
            "broadcast": "binomial_broadcast",
            "reduce": "binomial_reduce",
        }.get(op, f"ring_{op}")
    if op == "all_reduce" and algorithm == "tree":
        return "tree_all_reduce"
    return {"broadcast": "chain_broadcast", "reduce": "chain_reduce"}.get(op, f"ring_{op}")


def _call_links(call: dict[str, Any], node_of: dict[int, int] | None) -> list[Link]:
    kind, size = _kind(call), float(call["bytes"])
    if kind == "p2p":
        if call.get("src") is None or call.get("dst") is None:
            raise ValueError(f"{call['op']} needs src and dst")
        return [(int(call["src"]), int(call["dst"]), size)]
    ranks = [int(r) for r in call["ranks"] or []]
    n = len(ranks)
    if kind == "barrier" or n < 2:
        return []
    order = _ring(ranks, call.get("ring"))
    if kind in ("ring_all_reduce", "gloo_reduce_scatter"):
        return _ring_links(order, 2 * (n - 1) / n * size)
    if kind in ("ring_all_gather", "ring_reduce_scatter"):
        return _ring_links(order, (n - 1) / n * size)
    if kind == "direct_all_to_all":
        return [(a, b, size / n) for a in ranks for b in ranks if a != b]
    if kind in ("binomial_broadcast", "binomial_reduce"):
        edges = _binomial_edges(ranks, _root(call, ranks))
        return [(a, b, size) if kind == "binomial_broadcast" else (b, a, size) for a, b in edges]
    if kind == "chain_broadcast":
        chain = _chain_from(order, _root(call, ranks))
        return [(chain[i], chain[i + 1], size) for i in range(n - 1)]
    if kind == "chain_reduce":
        chain = _chain_from(order, _root(call, ranks))
        chain = chain[1:] + chain[:1]  # root's successor first, root last
        return [(chain[i], chain[i + 1], size) for i in range(n - 1)]
    # tree_all_reduce: S up (child -> parent) and S down (parent -> child) every edge
    edges = _tree_edges(order, node_of)
    return [link for a, b in edges for link in ((b, a, size), (a, b, size))]


def link_bytes(calls: pl.DataFrame, node_of: dict[int, int] | None = None) -> pl.DataFrame:
    """call_index, src, dst, bytes: the bytes each call puts on each directed link.

    `calls` has one row per call (not per rank): op, bytes, ranks (group order), backend, and
    where they apply algorithm, root, src, dst, ring. Calls with unknown bytes (null) put
    nothing on the links. `node_of` only shapes the NCCL tree (its chains follow the nodes);
    without it the group is taken as one node.
    """
    rows = []
    for i, call in enumerate(calls.to_dicts()):
        if call.get("bytes") is None:
            continue  # size unknown: say so upstream, never guess
        rows += [
            {"call_index": i, "src": a, "dst": b, "bytes": v}
            for a, b, v in _call_links(call, node_of)
        ]
    return pl.DataFrame(rows, schema=LINK_SCHEMA)


def _group_text(call: dict[str, Any]) -> str:
    ranks = call.get("ranks")
    if not ranks:
        ranks = [call.get("src"), call.get("dst")]
    return ",".join(str(r) for r in ranks)


MATRIX_LIMIT = 1024  # most ranks the dense matrix is written for (1M cells of JSON)


def rank_matrix(
    links: pl.DataFrame, ranks: Sequence[int]
) -> tuple[list[int], list[list[int]] | None, str | None]:
    """(matrix_ranks, matrix, warning): bytes src -> dst summed over ``links``, dense over the
    ranks that have traces or are a link's end (never over a declared world size).

    ``matrix[i][j]`` is the bytes from ``matrix_ranks[i]`` to ``matrix_ranks[j]``; with every
    rank 0..n-1 present, matrix_ranks is 0..n-1 and ``matrix[src][dst]`` indexes by rank. Past
    MATRIX_LIMIT ranks the matrix is None, with a warning (the traffic_links frame has them all).
    """
    ends = links["src"].to_list() + links["dst"].to_list()
    order = sorted({int(r) for r in ranks} | {int(r) for r in ends})
    if len(order) > MATRIX_LIMIT:
        return (
            order,
            None,
            f"traffic: {len(order)} ranks: the rank x rank matrix is left out (more than "
            f"{MATRIX_LIMIT}); the traffic_links frame holds every link",
        )
    at = {r: i for i, r in enumerate(order)}
    matrix = [[0] * len(order) for _ in order]
    for r in links.group_by("src", "dst").agg(pl.col("bytes").sum()).to_dicts():
        matrix[at[r["src"]]][at[r["dst"]]] = round(r["bytes"])
    return order, matrix, None


def traffic_summary(
    calls: pl.DataFrame,
    node_of: dict[int, int],
    world_size: int,
    ranks: Sequence[int] | None = None,
) -> dict:
    """summary.json's `traffic`: bytes per link class, per op, per group, and the rank matrix.

    Bytes are rounded to integers per reported total; inter_node_fraction uses the exact sums.
    Links touching a rank missing from node_of count as `unclassified_bytes`, with a warning.
    ``ranks`` (default: node_of's) are the ranks with traces: the matrix is over them and the
    links' ends (rank_matrix), not over world_size, which only bounds the ranks a link may name.
    """
    links = link_bytes(calls, node_of)
    bad = sorted(
        {r for r in links["src"].to_list() + links["dst"].to_list() if not 0 <= r < world_size}
    )
    if bad:
        raise ValueError(f"ranks {ranges(bad)} outside the world of {world_size}")

    info = calls.to_dicts()
    model: dict[str, list[str]] = {}
    for call in info:
        if call.get("bytes") is None:
            continue
        text = f"{str(call['backend']).lower()}: {_MODEL[_kind(call)]}"
        if text not in model.setdefault(call["op"], []):
            model[call["op"]].append(text)

    calls_meta = pl.DataFrame(
        {
            "call_index": list(range(len(info))),
            "op": [c["op"] for c in info],
            "group": [_group_text(c) for c in info],
        },
        schema={"call_index": pl.Int64, "op": pl.Utf8, "group": pl.Utf8},
    )
    nodes = pl.DataFrame(
        {"rank": list(node_of), "node": list(node_of.values())},
        schema={"rank": pl.Int64, "node": pl.Int64},
    )
    links = (
        links.join(calls_meta, on="call_index", how="left")
        .join(nodes.rename({"rank": "src", "node": "src_node"}), on="src", how="left")
        .join(nodes.rename({"rank": "dst", "node": "dst_node"}), on="dst", how="left")
        .with_columns(
            pl.when(pl.col("src_node").is_null() | pl.col("dst_node").is_null())
            .then(pl.lit("unclassified"))
            .when(pl.col("src_node") == pl.col("dst_node"))
            .then(pl.lit("intra"))
            .otherwise(pl.lit("inter"))
            .alias("link")
        )
    )

    def split(keys: list[str]) -> list[dict]:
        out = links.group_by(keys, maintain_order=True).agg(
            pl.col("bytes").filter(pl.col("link") == "intra").sum().alias("intra"),
            pl.col("bytes").filter(pl.col("link") == "inter").sum().alias("inter"),
            pl.col("bytes").sum().alias("bytes"),
        )
        # most bytes first, ties by key: the same order on every run
        out = out.sort(["bytes", *keys], descending=[True] + [False] * len(keys), nulls_last=True)
        return [
            {
                **{k: r[k] for k in keys},
                "intra": round(r["intra"]),
                "inter": round(r["inter"]),
                "bytes": round(r["bytes"]),
            }
            for r in out.to_dicts()
        ]

    exact = {  # sums of a Float64 column
        k: cast(float, links.filter(pl.col("link") == k)["bytes"].sum())
        for k in ("intra", "inter", "unclassified")
    }
    classified = exact["intra"] + exact["inter"]
    matrix_ranks, matrix, too_many = rank_matrix(links, list(node_of) if ranks is None else ranks)
    ends = links["src"].to_list() + links["dst"].to_list()
    missing = sorted({r for r in ends if r not in node_of})
    warnings = [
        f"traffic: rank{'s' if len(missing) > 1 else ''} {ranges(missing)} {'have' if len(missing) > 1 else 'has'} no node; their links are unclassified"
    ]
    warnings = (warnings if missing else []) + ([too_many] if too_many else [])
    return {
        "model": {op: "; ".join(texts) for op, texts in sorted(model.items())},
        "intra_node_bytes": round(exact["intra"]),
        "inter_node_bytes": round(exact["inter"]),
        "unclassified_bytes": round(exact["unclassified"]),
        "total_bytes": round(exact["intra"]) + round(exact["inter"]) + round(exact["unclassified"]),
        "inter_node_fraction": exact["inter"] / classified if classified else None,  # unknown
        "by_op": split(["op"]),
        "by_group": split(["group", "op"]),
        "matrix": matrix,
        "matrix_ranks": matrix_ranks,
        "warnings": warnings,
    }
