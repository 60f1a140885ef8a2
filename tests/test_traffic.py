"""Collective bytes on links, by the algorithm each backend really runs, on hand-counted cases."""

from __future__ import annotations

import polars as pl
import pytest

from tracekit.analyses.traffic import link_bytes, traffic_summary

S = 1200  # divisible by every group size used here, so every link's bytes are integers
TWO_NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def calls(*rows):
    base = {
        "op": None,
        "bytes": None,
        "ranks": None,
        "backend": "gloo",
        "algorithm": None,
        "root": None,
        "src": None,
        "dst": None,
        "ring": None,
    }
    return pl.DataFrame(
        [{**base, **r} for r in rows],
        schema={
            "op": pl.Utf8,
            "bytes": pl.Int64,
            "ranks": pl.List(pl.Int64),
            "backend": pl.Utf8,
            "algorithm": pl.Utf8,
            "root": pl.Int64,
            "src": pl.Int64,
            "dst": pl.Int64,
            "ring": pl.List(pl.Int64),
        },
    )


def links(frame):
    return {(r["src"], r["dst"]): r["bytes"] for r in link_bytes(frame).to_dicts()}


def test_dp_ring_all_reduce_on_two_nodes():
    """4 ranks x 2(3/4)S = 6S; of the ring links 0->1, 1->2, 2->3, 3->0 two cross nodes."""
    c = calls({"op": "all_reduce", "bytes": S, "ranks": [0, 1, 2, 3]})
    assert links(c) == {(0, 1): 1.5 * S, (1, 2): 1.5 * S, (2, 3): 1.5 * S, (3, 0): 1.5 * S}
    t = traffic_summary(c, TWO_NODES, 4)
    assert t["total_bytes"] == 6 * S
    assert t["inter_node_fraction"] == 0.5
    assert t["intra_node_bytes"] + t["inter_node_bytes"] == t["total_bytes"]
    assert "ring" in t["model"]["all_reduce"]
    assert t["by_op"] == [{"op": "all_reduce", "intra": 3 * S, "inter": 3 * S, "bytes": 6 * S}]


def test_gloo_reduce_scatter_is_an_all_reduce_nccl_is_not():
    group = [0, 1, 2, 3]
    gloo = link_bytes(calls({"op": "reduce_scatter", "bytes": S, "ranks": group}))
    ar = link_bytes(calls({"op": "all_reduce", "bytes": S, "ranks": group}))
    nccl = link_bytes(
        calls({"op": "reduce_scatter", "bytes": S, "ranks": group, "backend": "nccl"})
    )
    assert gloo["bytes"].sum() == ar["bytes"].sum() == 6 * S
    assert nccl["bytes"].sum() == 4 * (3 / 4) * S
    t = traffic_summary(calls({"op": "reduce_scatter", "bytes": S, "ranks": group}), TWO_NODES, 4)
    assert "all_reduce" in t["model"]["reduce_scatter"]


def test_all_gather_ring():
    assert links(calls({"op": "all_gather", "bytes": S, "ranks": [0, 1, 2]})) == {
        (0, 1): 2 / 3 * S,
        (1, 2): 2 / 3 * S,
        (2, 0): 2 / 3 * S,
    }


def test_hsdp_replicate_across_nodes_shard_inside():
    """Shard groups {0,1}, {2,3} sit inside nodes; replicate groups {0,2}, {1,3} cross them."""
    c = calls(
        {"op": "reduce_scatter", "bytes": S, "ranks": [0, 1], "backend": "nccl"},
        {"op": "reduce_scatter", "bytes": S, "ranks": [2, 3], "backend": "nccl"},
        {"op": "all_reduce", "bytes": S // 2, "ranks": [0, 2], "backend": "nccl"},
        {"op": "all_reduce", "bytes": S // 2, "ranks": [1, 3], "backend": "nccl"},
    )
    t = traffic_summary(c, TWO_NODES, 4)
    by_group = {(g["group"], g["op"]): (g["intra"], g["inter"]) for g in t["by_group"]}
    # reduce_scatter of 2: each rank sends S/2; all_reduce of 2 (size S/2): each sends S/2.
    assert by_group == {
        ("0,1", "reduce_scatter"): (S, 0),
        ("2,3", "reduce_scatter"): (S, 0),
        ("0,2", "all_reduce"): (0, S),
        ("1,3", "all_reduce"): (0, S),
    }
    assert t["inter_node_fraction"] == 0.5


def test_binomial_broadcast_on_eight_ranks():
    """log2 8 = 3 rounds: 1 + 2 + 4 = 7 sending edges, S each, every non-root reached once."""
    c = calls({"op": "broadcast", "bytes": S, "ranks": list(range(8)), "root": 3})
    l = links(c)
    assert len(l) == 7 and set(l.values()) == {S}
    assert sorted(dst for _, dst in l) == [r for r in range(8) if r != 3]
    # round 0: 3->4; round 1: 3->5, 4->6; round 2: 3->7, 4->0, 5->1, 6->2
    assert set(l) == {(3, 4), (3, 5), (4, 6), (3, 7), (4, 0), (5, 1), (6, 2)}
    reduce = links(calls({"op": "reduce", "bytes": S, "ranks": list(range(8)), "root": 3}))
    assert set(reduce) == {(b, a) for a, b in l}


def test_nccl_broadcast_and_reduce_chain_along_the_ring():
    ring = [0, 2, 1, 3]
    b = links(
        calls(
            {
                "op": "broadcast",
                "bytes": S,
                "ranks": [0, 1, 2, 3],
                "root": 1,
                "backend": "nccl",
                "ring": ring,
            }
        )
    )
    assert b == {(1, 3): S, (3, 0): S, (0, 2): S}
    r = links(
        calls(
            {
                "op": "reduce",
                "bytes": S,
                "ranks": [0, 1, 2, 3],
                "root": 1,
                "backend": "nccl",
                "ring": ring,
            }
        )
    )
    assert r == {(3, 0): S, (0, 2): S, (2, 1): S}


def test_nccl_tree_all_reduce():
    """Chains 0-1 and 2-3 inside the nodes, leaders 0-2 across: S each way on 3 edges."""
    c = calls(
        {
            "op": "all_reduce",
            "bytes": S,
            "ranks": [0, 1, 2, 3],
            "backend": "nccl",
            "algorithm": "TREE",
        }
    )
    t = traffic_summary(c, TWO_NODES, 4)
    assert t["total_bytes"] == 2 * 3 * S  # 2(n-1)S, the same total as the ring
    assert t["inter_node_bytes"] == 2 * S
    assert t["matrix"][0][2] == t["matrix"][2][0] == S
    assert "tree" in t["model"]["all_reduce"]


def test_all_to_all_direct_pairs():
    l = links(calls({"op": "all_to_all", "bytes": S, "ranks": [0, 1, 2, 3]}))
    assert len(l) == 12 and set(l.values()) == {S / 4}
    t = traffic_summary(
        calls({"op": "all_to_all", "bytes": S, "ranks": [0, 1, 2, 3]}), TWO_NODES, 4
    )
    assert t["inter_node_bytes"] == 8 * S // 4 and t["intra_node_bytes"] == 4 * S // 4


def test_send_recv_and_barrier():
    c = calls(
        {"op": "send", "bytes": S, "src": 1, "dst": 2},
        {"op": "recv", "bytes": 7, "src": 3, "dst": 2},
        {"op": "barrier", "bytes": 0, "ranks": [0, 1, 2, 3]},
    )
    assert links(c) == {(1, 2): S, (3, 2): 7}
    t = traffic_summary(c, TWO_NODES, 4)
    assert (t["intra_node_bytes"], t["inter_node_bytes"]) == (7, S)
    assert {g["group"] for g in t["by_group"]} == {"1,2", "3,2"}


def test_matrix_rows_are_what_each_rank_sends():
    c = calls(
        {"op": "all_reduce", "bytes": S, "ranks": [0, 1, 2, 3]},
        {"op": "all_gather", "bytes": S, "ranks": [0, 1]},
        {"op": "broadcast", "bytes": S, "ranks": [0, 1, 2, 3], "root": 2},
        {"op": "all_to_all", "bytes": S, "ranks": [1, 2, 3]},
        {"op": "send", "bytes": S, "src": 3, "dst": 0},
    )
    t = traffic_summary(c, TWO_NODES, 4)
    sent = link_bytes(c).group_by("src").agg(pl.col("bytes").sum())
    sent = dict(zip(sent["src"].to_list(), sent["bytes"].to_list()))
    for rank in range(4):
        assert sum(t["matrix"][rank]) == sent.get(rank, 0)
        assert t["matrix"][rank][rank] == 0
    assert sum(map(sum, t["matrix"])) == t["total_bytes"]
    assert sum(o["intra"] + o["inter"] for o in t["by_op"]) == t["total_bytes"]


def test_nccl_ring_order_decides_what_crosses_nodes():
    group = [0, 1, 2, 3]
    plain = traffic_summary(
        calls({"op": "all_reduce", "bytes": S, "ranks": group, "backend": "nccl"}), TWO_NODES, 4
    )
    crossed = traffic_summary(
        calls(
            {
                "op": "all_reduce",
                "bytes": S,
                "ranks": group,
                "backend": "nccl",
                "ring": [0, 2, 1, 3],
            }
        ),
        TWO_NODES,
        4,
    )
    assert plain["inter_node_fraction"] == 0.5
    assert crossed["inter_node_fraction"] == 1.0  # 0->2, 2->1, 1->3, 3->0: all four cross
    assert crossed["total_bytes"] == plain["total_bytes"]


def test_ring_in_comm_ranks_maps_to_the_group():
    """NCCL logs print ring order in ranks of the communicator; group [4,5,6,7] -> globals."""
    l = links(
        calls(
            {
                "op": "all_gather",
                "bytes": S,
                "ranks": [4, 5, 6, 7],
                "backend": "nccl",
                "ring": [0, 2, 1, 3],
            }
        )
    )
    assert set(l) == {(4, 6), (6, 5), (5, 7), (7, 4)}


def test_unknown_size_and_missing_nodes():
    c = calls(
        {"op": "all_reduce", "bytes": None, "ranks": [0, 1]},
        {"op": "all_reduce", "bytes": S, "ranks": [0, 1, 2]},
    )
    t = traffic_summary(c, {0: 0, 1: 0}, 3)
    assert t["total_bytes"] == 3 * (4 / 3) * S
    assert t["unclassified_bytes"] == 2 * (4 / 3) * S and t["warnings"]
    assert (
        t["intra_node_bytes"] + t["inter_node_bytes"] + t["unclassified_bytes"] == t["total_bytes"]
    )


def test_bad_input():
    with pytest.raises(ValueError):
        link_bytes(calls({"op": "allreduce", "bytes": S, "ranks": [0, 1]}))
    with pytest.raises(ValueError):
        link_bytes(calls({"op": "all_reduce", "bytes": S, "ranks": [0, 1], "backend": "mpi"}))
    with pytest.raises(ValueError):
        link_bytes(calls({"op": "broadcast", "bytes": S, "ranks": [0, 1], "root": 5}))
    with pytest.raises(ValueError):
        traffic_summary(calls({"op": "all_reduce", "bytes": S, "ranks": [0, 4]}), {0: 0, 4: 0}, 4)
