"""NCCL_DEBUG=INFO logs: real excerpts from public NVIDIA/nccl and pytorch/pytorch issues.

Each tests/data/nccl/*.log starts with a comment naming the issue it was copied from; the values
asserted here can be read in those files.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from tracekit.errors import TracekitError
from tracekit.ingest.nccl_log import rank_layout, read_nccl_logs, ring_order

DATA = Path(__file__).parent / "data" / "nccl"
GPU = Path(__file__).parent / "data" / "gpu"
IB_16 = DATA / "nccl_issue1412_ib_2nodes_16ranks.log"  # 2.19+, nccl-tests, 2 x 8 GPUs
V2_10 = DATA / "nccl_issue133_2.10.3_2nodes.log"  # NCCL 2.10.3, 2 x 8 A800
TORCH_4 = DATA / "nccl_pytorch75658_4gpus.log"  # torch, 4 processes, 1 host
LINKS = DATA / "nccl_issue1953_ring_links_same_hostname.log"  # 2 nodes both named "ubuntu"
TUNING = DATA / "nccl_issue1453_tuning_truncated_channels.log"  # tuning + cut Channel lines
OLD_INIT = DATA / "nccl_issue629_init_complete_2hosts.log"  # "- Init COMPLETE" lines only

# Single real lines from other threads, for formats no fixture file has.
SNIPPETS = [
    # https://github.com/NVIDIA/nccl/issues/1752 (2.2x tuning format: op name, algo names)
    "se2-r1-gpu-1:166761:166761 [0] NCCL INFO AllReduce: 16777216 Bytes -> Algo TREE proto LL128 channel{Lo..Hi}={0..15}",
    "se2-r1-gpu-1:166761:166761 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo NVLS_TREE proto SIMPLE channel{Lo..Hi}={0..15}",
    # https://github.com/NVIDIA/nccl/issues/1595 (launcher stripped host:pid:tid)
    "[0] NCCL INFO 805306368 Bytes -> Algo 1 proto 2 time 3970.683594",
    # https://github.com/NVIDIA/nccl/issues/1936 (version banner with a prefix, 2.27)
    "2e5hmh4t0q1th5f:205631:205631 [0] NCCL INFO NCCL version 2.27.5+cuda12.9",
    # https://github.com/NVIDIA/nccl-tests/issues/352 (timestamped WARN with file:line)
    "[2025-10-23 10:26:31] lrdn2146:1399931:1399978 [3] graph/search.cc:1127 NCCL WARN Could not find a path for pattern 1, falling back to simple order",
    # https://github.com/NVIDIA/nccl/issues/300 (Open MPI --tag-output prefix, NCCL 2.5.6)
    "[1,0]<stdout>:NCCL version 2.5.6+cuda10.2",
    # https://github.com/NVIDIA/nccl/issues/302 (2.5 trees: two per channel joined by '|')
    "[155] crow-ib-new-nccl-256-info-19:5330:5499 [3] NCCL INFO Trees [0] 154/-1/-1->155->153|153->155->154/-1/-1 [1] 153/-1/-1->155->154|154->155->153/-1/-1",
    # https://github.com/NVIDIA/nccl/issues/1605 (ncclCommSplit line, then the 2.19+ info line)
    "myhost:2261199:2261301 [0] NCCL INFO ncclCommSplit comm 0x595122703ca0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1a000 parent 0x5951213c0f90 color 1684518034 key 0 commId 0x5a16c3838ce6f1f8 - Init START",
    "myhost:2261199:2261301 [0] NCCL INFO comm 0x595122703ca0 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
    "myhost:2261199:2261301 [0] NCCL INFO Channel 00/04 :    0   1",
    "myhost:2261199:2261301 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IBext_v8/0/GDRDMA",
]


# -- the fixture files --------------------------------------------------------------------------
def test_two_nodes_ib_16_ranks():
    log = read_nccl_logs(IB_16)
    c = log.comms.sort("rank")
    assert c["rank"].to_list() == [3, 5, 6, 7]
    assert set(c["nranks"]) == {16} and set(c["nnodes"]) == {2} and set(c["local_ranks"]) == {8}
    assert c["local_rank"].to_list() == [3, 5, 6, 7]
    assert c["comm_id"].to_list() == ["0x8e0c400", "0x8e84880", "0x8ec0ac0", "0x8efcbc0"]
    assert ring_order(log) == [0, 5, 4, 7, 6, 3, 2, 1, 8, 13, 12, 15, 14, 11, 10, 9]
    rings = log.rings.sort("channel")
    assert rings["channel"].to_list() == [0, 1, 2, 3, 4] and set(rings["nchannels"]) == {8}
    assert rings["complete"].all()
    assert rings["order"][3].to_list() == [0, 5, 12, 15, 14, 11, 10, 9, 8, 13, 4, 7, 6, 3, 2, 1]
    layout = rank_layout(log)
    assert layout[6] == {"host": "swat1-04", "node": 0, "local_rank": 6, "source": "init"}
    # one node's INIT lines of two: the other 12 ranks placed from localRanks 8, and said so
    assert sorted(layout) == list(range(16))
    assert {r for r, v in layout.items() if v["source"] == "init"} == {3, 5, 6, 7}
    assert layout[12] == {"host": None, "node": 1, "local_rank": 4, "source": "localRanks"}
    assert layout[0] == {"host": "swat1-04", "node": 0, "local_rank": 0, "source": "localRanks"}
    assert len({v["node"] for v in layout.values()}) == 2  # as the log's nNodes 2 says
    assert (
        "NCCL logs cover 4 of 16 ranks (nNodes 2, 1 seen): ranks 0-2,4,8-15 placed from "
        "localRanks only (node = rank // 8)"
    ) in log.warnings


def test_transports_and_trees():
    log = read_nccl_logs(IB_16)
    t = log.transports
    assert t.height == 14
    net = t.filter(t["transport"] == "NET").sort("channel", "direction")
    assert net.select("channel", "src_rank", "dst_rank", "direction", "via").rows()[:2] == [
        (3, 13, 4, "receive", "NET/IB/3"),
        (3, 5, 12, "send", "NET/IB/3"),
    ]
    assert set(t.filter(t["transport"] == "P2P")["via"]) == {"P2P/direct pointer/read"}
    trees = log.trees.filter(log.trees["rank"] == 1).sort("channel")
    assert trees["up"].to_list() == [0] * 8
    assert trees["down"].to_list() == [[2], [], [2], [2], [2], [], [2], [2]]
    torch_log = read_nccl_logs(TORCH_4)
    assert torch_log.transports.select("channel", "src_rank", "dst_rank", "via").rows() == [
        (0, 1, 2, "P2P/IPC")
    ]
    rank2 = torch_log.trees.filter(torch_log.trees["rank"] == 2).sort("channel")
    assert rank2["up"].to_list() == [None, 0, None, 0]
    assert rank2["down"].to_list() == [[0], [], [0], []]


def test_nccl_2_10_version_rings_and_trees_without_comm_lines():
    log = read_nccl_logs(V2_10)
    assert log.version == "2.10.3+cuda11.0"
    assert ring_order(log) == [0, 7, 6, 5, 12, 11, 10, 9, 8, 15, 14, 13, 4, 3, 2, 1]
    assert ring_order(log, nranks=16) == ring_order(log)
    assert ring_order(log, nranks=8) is None
    r12 = log.trees.filter(log.trees["rank"] == 12).sort("channel")
    assert r12.select("up", "down").rows() == [(4, [13]), (None, [13, 4])]
    assert log.comms.height == 0
    # no INIT lines, but nccl-tests' header places rank 15 (the excerpt keeps only that one)
    assert log.placements.select("rank", "host", "pid", "device", "bus_id", "group").rows() == [
        (15, "nodeb", 65671, 7, "0xcf", None)
    ]
    assert log.placements["gpu"][0] == "NVIDIA A800-SXM4-80GB"
    assert rank_layout(log) == {
        15: {"host": "nodeb", "node": 0, "local_rank": None, "source": "nccl-tests"}
    }
    assert any("no communicator lines" in w and "nccl-tests" in w for w in log.warnings)
    assert "NCCL logs cover 1 of at least 16 ranks (1 host seen): ranks 0-14 unknown" in (
        log.warnings
    )


def test_pytorch_four_processes():
    log = read_nccl_logs(TORCH_4)
    assert ring_order(log) == [0, 1, 2, 3]
    assert log.rings.height == 4 and set(log.rings["pid"]) == {4055975}
    assert sorted(set(log.trees["rank"])) == [0, 1, 2, 3]


def test_ring_links_and_hosts_with_the_same_name():
    log = read_nccl_logs(LINKS)
    (comm,) = log.comms.to_dicts()
    assert (
        comm["rank"],
        comm["nranks"],
        comm["nnodes"],
        comm["local_ranks"],
        comm["local_rank"],
    ) == (3, 4, 2, 2, 1)
    # both nodes are called "ubuntu": the node comes from rank // localRanks
    layout = rank_layout(log)
    assert layout[3] == {"host": "ubuntu", "node": 1, "local_rank": 1, "source": "init"}
    assert {r: (v["node"], v["local_rank"], v["source"]) for r, v in layout.items()} == {
        0: (0, 0, "localRanks"),
        1: (0, 1, "localRanks"),
        2: (1, 0, "localRanks"),
        3: (1, 1, "init"),
    }
    assert any("cover 1 of 4 ranks (nNodes 2, 1 seen): ranks 0-2" in w for w in log.warnings)
    order = ring_order(log)
    assert order == [0, 1, 2, 3]
    links = {
        r["rank"]: (r["prev"], r["next"])
        for r in log.ring_links.filter(log.ring_links["channel"] == 0).to_dicts()
    }
    assert links == {0: (3, 1), 3: (2, 0)}
    for rank, (prev, nxt) in links.items():  # the links agree with Channel 00
        i = order.index(rank)
        assert (order[i - 1], order[(i + 1) % 4]) == (prev, nxt)
    # rank 3's rows belong to its comm; "Tree 1 : 2 -> 0 -> 1/-1/-1" equals "Trees [1] 1/-1/-1->0->2"
    assert set(log.trees.filter(log.trees["rank"] == 3)["comm_id"]) == {"0x5585f4e02e10"}
    r0 = log.trees.filter(log.trees["rank"] == 0).sort("channel")
    assert r0.select("channel", "up", "down").rows() == [(0, None, [1, 2]), (1, 2, [1])]


def test_ring_rebuilt_from_links_when_channel_lines_are_missing(tmp_path):
    lines = [l for l in LINKS.read_text().splitlines() if "Channel" not in l]
    lines += [  # the other two ranks, as the same NCCL version prints them
        "ubuntu:1630804:1630804 [1] NCCL INFO Ring 00 : 0 -> 1 -> 2",
        "ubuntu:2681677:2681677 [0] NCCL INFO Ring 00 : 1 -> 2 -> 3",
    ]
    (tmp_path / "a.log").write_text("\n".join(lines) + "\n")
    assert ring_order(read_nccl_logs(tmp_path / "a.log")) == [0, 1, 2, 3]


def test_tuning_lines_and_cut_channel_lines():
    log = read_nccl_logs(TUNING)
    t = log.tuning
    assert t.height == 8  # includes the one glued to an nccl-tests row
    assert set(t["host"]) == {"h100clust-worker-1"} and set(t["pid"]) == {497888}
    assert t.select("bytes", "algo", "proto", "time_us").rows()[0] == (
        65536,
        "TREE",
        "LL",
        37.798233,
    )
    assert t.filter(t["bytes"] == 131072).select("algo", "proto").unique().rows() == [
        ("TREE", "LL128")
    ]
    assert t.filter(t["bytes"] == 131072).height == 3
    assert t["op"].null_count() == 8  # 2.19-2.21 lines do not name the op
    # 24 ranks, but each Channel line lists only 20 of them: never used as an order
    assert log.rings.height == 9 and not log.rings["complete"].any()
    assert set(log.rings["order"].list.len()) == {20}
    assert ring_order(log) is None and ring_order(log, nranks=24) is None
    assert any("incomplete" in w for w in log.warnings)


def test_old_init_complete_lines_two_hosts():
    log = read_nccl_logs(OLD_INIT)
    c = log.comms.sort("rank")
    assert c["rank"].to_list() == [2, 4, 5, 8, 9, 12, 14, 15]
    r15 = c.filter(c["rank"] == 15).to_dicts()[0]
    assert (r15["cuda_dev"], r15["bus_id"], r15["comm_id"]) == (7, "e7000", "0x7fdf08000d00")
    layout = rank_layout(log)
    assert {r: v["node"] for r, v in layout.items()} == {
        2: 0,
        4: 0,
        5: 0,
        8: 1,
        9: 1,
        12: 1,
        14: 1,
        15: 1,
    }
    assert layout[8]["host"] == "A03-R28-I49-3-9000018"
    assert layout[8]["local_rank"] is None  # only 8 of 16 ranks logged: not guessed
    # no localRanks in this format: the other 8 are not placed, and the warning says which
    assert (
        "NCCL logs cover 8 of 16 ranks (2 hosts seen): ranks 0,1,3,6,7,10,11,13 unknown"
        in log.warnings
    )


def test_nccl_tests_headers_place_ranks_on_hosts():
    log = read_nccl_logs(TUNING)  # mpirun's "[0] " tag in front of each header
    p = log.placements.sort("rank")
    assert p["rank"].to_list() == list(range(1, 15))
    assert p.filter(p["rank"] == 8).select("host", "pid", "device", "bus_id", "group").rows() == [
        ("h100clust-worker-32", 496763, 0, "0xa4", 0)
    ]
    assert set(p["gpu"]) == {"NVIDIA H100 80GB HBM3"} and p["line"].to_list()[0] == 2
    layout = rank_layout(log)
    assert {r: v["node"] for r, v in layout.items()} == {r: int(r >= 8) for r in range(1, 15)}
    assert {v["source"] for v in layout.values()} == {"nccl-tests"}
    # ring lines name ranks up to 23: the job has at least 24
    assert "NCCL logs cover 14 of at least 24 ranks (2 hosts seen): ranks 0,15-23 unknown" in (
        log.warnings
    )


def test_header_and_init_lines_together(tmp_path):
    """nccl-tests' headers give the hosts of ranks whose INIT lines are not in the log."""
    init = [l for l in IB_16.read_text().splitlines() if "comm 0x" in l]
    heads = [
        f"#  Rank {r:2d} Group  0 Pid 2017630 on {'swat1-04' if r < 8 else 'swat1-05'} "
        f"device {r % 8:2d} [0x{r:02x}] NVIDIA H100"
        for r in range(16)
    ]
    (tmp_path / "a.log").write_text("\n".join(heads + init) + "\n")
    log = read_nccl_logs(tmp_path / "a.log")
    layout = rank_layout(log)
    assert layout[12] == {"host": "swat1-05", "node": 1, "local_rank": 4, "source": "nccl-tests"}
    assert layout[6]["source"] == "init" and layout[6]["host"] == "swat1-04"
    assert not any("cover" in w for w in log.warnings)


def test_lines_cut_off_mid_text_are_named(tmp_path):
    lines = IB_16.read_text().splitlines()
    cut = [
        lines[1][:-22],  # "comm ... localRanks 8 localRa": a key without its value
        lines[8][:-9],  # "Trees [0] ... [7] 2/-1/-" : a half-written item
        lines[12][: lines[12].index(" 6[6]") + 3],  # "Channel 00/0 : 7[7] -> 6": no "via"
        lines[13][:40] + lines[14],  # another process's prefix inside a message
    ]
    body = "\n".join(lines[2:7] + cut) + "\n" + lines[2][:-30]  # the file ends mid-line
    (tmp_path / "cut.log").write_bytes(body.encode())
    log = read_nccl_logs(tmp_path / "cut.log")
    (w,) = [w for w in log.warnings if "cut off mid-text" in w]
    assert w.startswith("5 lines cut off mid-text, parsed as far as they go: ")
    assert f"{tmp_path / 'cut.log'}:6: comm line cut off" in w
    assert f"{tmp_path / 'cut.log'}:7: Trees line cut off" in w
    assert f"{tmp_path / 'cut.log'}:8: link line cut off" in w
    assert "(and 2 more)" in w
    # parsed as far as it goes: the comm line still gives rank 6 of 16
    assert 6 in log.comms["rank"].to_list()
    # the whole fixture files have no cut lines but NCCL's own 1024-byte cut in the GPU run
    for f in sorted(DATA.glob("*.log")):
        assert not any("cut off" in w for w in read_nccl_logs(f).warnings), f
    gpu = read_nccl_logs(GPU / "dp-cuda-nccl")
    assert any(
        "vm.490.log:288: Trees line cut off at NCCL's 1024-byte line limit" in w
        for w in gpu.warnings
    )
    (tmp_path / "h.log").write_text(
        "#  Rank  1 Group  0 Pid 497889 on h100clust-wor\n" + lines[1] + "\n"
    )
    assert any(
        "h.log:1: nccl-tests rank header cut off" in w
        for w in read_nccl_logs(tmp_path / "h.log").warnings
    )


def test_a_huge_nranks_is_not_listed_rank_by_rank(tmp_path):
    """A damaged or hostile line can claim 10^9 ranks: the warning names the gaps as ranges,
    nothing is placed rank by rank (its time: benchmarks/timing_bounds.py)."""
    line = "h:1:2 [0] NCCL INFO comm 0x1 rank 5 nRanks 999999999 nNodes 9 localRanks 8 localRank 5"
    (tmp_path / "x.log").write_text(line + "\n")
    log = read_nccl_logs(tmp_path / "x.log")
    assert sorted(rank_layout(log)) == [5]
    assert (
        "NCCL logs cover 1 of 999999999 ranks (nNodes 9, 1 seen): ranks 0-4,6-999999998 unknown"
        in (log.warnings)
    )


def _log_folders(tmp_path: Path) -> list[Path]:
    """Every NCCL log of the test data as a run folder: each tests/data/nccl file on its own,
    and the GPU runs of tests/data/gpu that kept their logs."""
    runs = []
    for f in sorted(DATA.glob("*.log")):
        run = tmp_path / f.stem
        (run / "nccl").mkdir(parents=True)
        (run / "run.json").write_text("{}")
        (run / "nccl" / f.name).write_bytes(f.read_bytes())
        runs.append(run)
    runs += [d for d in sorted(GPU.iterdir()) if list((d / "nccl").glob("*.log"))]
    return runs


def test_topology_layout_is_rank_layout_on_every_log(tmp_path):
    from tracekit.ingest.load import read_nccl

    runs = _log_folders(tmp_path)
    assert len(runs) >= 7
    for run in runs:
        direct = rank_layout(read_nccl_logs(run))
        logs = read_nccl(run)
        assert logs is not None, run
        assert (logs.layout or None) == (direct or None), run


def test_snippet_formats(tmp_path):
    (tmp_path / "s.log").write_text("\n".join(SNIPPETS) + "\n")
    log = read_nccl_logs(tmp_path / "s.log")
    assert log.version == "2.27.5+cuda12.9"
    assert any("several NCCL versions" in w for w in log.warnings)
    assert any("1 NCCL WARN lines, first: Could not find a path" in w for w in log.warnings)
    t = log.tuning.sort("bytes")
    assert t.select("op", "nccl_op", "bytes", "algo", "proto", "channel_lo", "channel_hi").rows()[
        :2
    ] == [
        ("all_reduce", "AllReduce", 16777216, "TREE", "LL128", 0, 15),
        ("all_reduce", "AllReduce", 33554432, "NVLS_TREE", "SIMPLE", 0, 15),
    ]
    bare = t.filter(t["bytes"] == 805306368).to_dicts()[0]
    assert (bare["host"], bare["algo"], bare["proto"], bare["time_us"]) == (
        None,
        "RING",
        "SIMPLE",
        3970.683594,
    )
    tree = log.trees.filter(log.trees["rank"] == 155).sort("channel")
    assert tree.select("up", "down").rows() == [(153, [154]), (154, [153])]
    (comm,) = log.comms.to_dicts()
    assert (comm["unique_id"], comm["nnodes"], comm["bus_id"]) == ("0x5a16c3838ce6f1f8", 2, "1a000")
    assert log.rings["comm_id"].to_list() == ["0x595122703ca0"]  # opened by Init START
    assert log.transports.select("comm_id", "via", "direction").rows() == [
        ("0x595122703ca0", "NET/IBext_v8/0/GDRDMA", "receive")
    ]


def test_folder_gz_and_run_folder(tmp_path):
    log = read_nccl_logs(DATA)  # the .json dumps there are not taken for logs
    assert len(log.files) == 6 and all(f.endswith(".log") for f in log.files)
    assert log.version == "2.10.3+cuda11.0"
    run = tmp_path / "run"
    (run / "nccl").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    with gzip.open(run / "nccl" / "h.1.log.gz", "wb") as f:
        f.write(IB_16.read_bytes())
    assert ring_order(read_nccl_logs(run)) == ring_order(read_nccl_logs(IB_16))


def test_large_log_streams_linearly(tmp_path):
    """~120k lines (the 16-rank excerpt repeated): every repeat is read (its time:
    benchmarks/timing_bounds.py)."""
    big = tmp_path / "big.log"
    body = IB_16.read_bytes()
    with open(big, "wb") as f:
        for _ in range(4000):
            f.write(body)
    log = read_nccl_logs(big)
    assert log.transports.height == 14 * 4000
    assert ring_order(log) == ring_order(read_nccl_logs(IB_16))


# -- bad input ----------------------------------------------------------------------------------
def bad(path: Path) -> str:
    with pytest.raises(TracekitError) as info:
        read_nccl_logs(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_empty_file(tmp_path):
    (tmp_path / "x.log").write_bytes(b"")
    assert "no NCCL log lines" in bad(tmp_path / "x.log")


def test_binary_garbage(tmp_path):
    (tmp_path / "x.log").write_bytes(bytes(range(128, 256)) * 64 + b"\n" + bytes(range(256)) * 16)
    assert "not text" in bad(tmp_path / "x.log")


def test_garbage_lines_inside_a_real_log_are_counted(tmp_path):
    (tmp_path / "x.log").write_bytes(b"\xff\xfe NCCL \x80\n" + V2_10.read_bytes() + b"\x00" * 5000)
    log = read_nccl_logs(tmp_path / "x.log")
    assert ring_order(log)[:3] == [0, 7, 6]
    assert any("1 lines were not UTF-8" in w for w in log.warnings)


def test_pickle_and_json_are_not_logs(tmp_path):
    import pickle

    (tmp_path / "x.log").write_bytes(pickle.dumps({"entries": []}))
    bad(tmp_path / "x.log")
    bad(DATA / "fr_rank0.json")


def test_unreadable_and_missing(tmp_path):
    with pytest.raises(TracekitError, match="no such file"):
        read_nccl_logs(tmp_path / "nope.log")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TracekitError, match="no NCCL log files"):
        read_nccl_logs(tmp_path / "empty")
    (tmp_path / "broken.log.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert "cannot read NCCL log" in bad(tmp_path / "broken.log.gz")


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(
            [
                b"NCCL INFO ",
                b"host:1:2 ",
                b"[0] ",
                b"Channel 00/02 : ",
                b"0 1 ",
                b"-> ",
                b"Ring 00 : ",
                b"Trees [0] ",
                b"1/-1/-1->0->-1",
                b"comm 0x1 rank 0 nranks 2 ",
                b"Bytes -> Algo 9 proto 7 ",
                b"\n",
                b"\xff",
                b"NCCL version 2.1",
                b" via P2P/IPC",
                b"99999999999999999999999 ",
                b"time e ",
                b"time 1e999",
                b"localRank 123456789012345 ",
                b"nNodes ff ",
            ]
        ),
        max_size=40,
    )
)
def test_any_mix_of_fragments_parses_or_raises_tracekit_error(tmp_path, parts):
    path = tmp_path / "f.log"
    path.write_bytes(b"".join(parts))
    try:
        log = read_nccl_logs(path)
    except TracekitError as exc:
        assert str(path) in str(exc)
        return
    rank_layout(log)
    ring_order(log)
