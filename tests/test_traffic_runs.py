"""Traffic of real runs on two logical nodes, and NCCL logs wired into the analysis.

hsdp (shard inside a node, replicate across) against zero3 (shard across everything) on 2 nodes
x 2 ranks: the point of HSDP is that only the replicas' all-reduce crosses nodes. The NCCL
tests put the real NCCL_DEBUG excerpts of tests/data/nccl/ into a run folder beside a real
trace, as `tracekit run --backend nccl` leaves them in <run>/nccl/.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from builders.traces import NCCL_DATA

from tracekit import runfolder
from tracekit.analyses.traffic import link_bytes
from tracekit.analyses.traffic_section import model_calls
from tracekit.analysis import analyze
from tracekit.capture.launch import RunOptions, run_job
from tracekit.ingest.nccl_log import read_nccl_logs, ring_order

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DP = REPO / "sample_traces" / "dp"
NCCL_LOGS = REPO / "tests" / "data" / "nccl"
NCCL_TRACE = NCCL_DATA


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("traffic")
    summaries = {}
    for strategy in ("hsdp", "zero3"):
        run = run_job(RunOptions(strategy, nproc=4, nodes=2, steps=2, out=out))
        assert runfolder.load_run_json(run)["status"] == "ok", runfolder.load_run_json(run)[
            "errors"
        ]
        summaries[strategy] = analyze(run).summary_dict()  # summary.json as written
    return summaries


@pytest.mark.slow
def test_hsdp_keeps_most_bytes_inside_nodes(two_nodes: dict[str, dict]) -> None:
    hsdp, zero3 = two_nodes["hsdp"]["traffic"], two_nodes["zero3"]["traffic"]
    for t in (hsdp, zero3):
        assert t["intra_node_bytes"] + t["inter_node_bytes"] == t["total_bytes"]
    assert hsdp["per_step"]["inter_node_bytes"] < 0.5 * zero3["per_step"]["inter_node_bytes"], (
        hsdp["per_step"],
        zero3["per_step"],
    )
    by_dim = {r["dim"]: r for r in hsdp["by_dim"]}
    assert by_dim["shard"]["inter"] == 0 and by_dim["replicate"]["intra"] == 0
    assert zero3["inter_node_fraction"] == 0.5  # rings over 0..3 on 2 nodes


@pytest.mark.slow
def test_busbw_per_process_group(two_nodes: dict[str, dict]) -> None:
    per_group = two_nodes["hsdp"]["collectives"]["per_group"]
    dims = {r["dim"] for r in per_group}
    assert {"shard", "replicate"} <= dims
    for r in per_group:
        assert r["time_basis"] == "transfer" and r["busbw_gbps"] > 0 and r["count"] > 0, r


def _nccl_run(
    tmp_path: Path, logs: list[str], trace: Path | None = None, topology: bool = True
) -> Path:
    """A run folder: the real 2-rank DP sample (or one real NCCL trace) plus NCCL log excerpts."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE_DP, run, ignore=shutil.ignore_patterns("analysis"))
    if trace is not None:
        shutil.rmtree(run / "traces")
        (run / "traces").mkdir()
        shutil.copy(trace, run / "traces" / "rank0.json.gz")
    for name in logs:
        shutil.copy(NCCL_LOGS / name, run / "nccl" / name)
    if not topology:
        data = json.loads((run / "run.json").read_text())
        data.pop("topology")
        (run / "run.json").write_text(json.dumps(data))
    return run


def test_topology_from_nccl_logs_when_run_json_lacks_it(tmp_path: Path) -> None:
    """The log (16 ranks, nNodes 2, localRanks 8) shows ranks 3, 5, 6, 7 on swat1-04; the traced
    ranks 0 and 1 are placed by localRanks: node 0."""
    run = _nccl_run(tmp_path, ["nccl_issue1412_ib_2nodes_16ranks.log"], topology=False)
    a = analyze(run)
    assert a.summary.topology.source == "nccl_log"
    assert a.summary.topology.nodes == {"0": 0, "1": 0}
    logs = a.summary.nccl.logs
    assert {r: v.host for r, v in logs.layout.items() if v.source == "init"} == {
        "3": "swat1-04",
        "5": "swat1-04",
        "6": "swat1-04",
        "7": "swat1-04",
    }
    # the other 12 ranks from localRanks 8, on the two nodes the log's nNodes names
    assert len(logs.layout) == 16 and logs.nodes == 2
    assert any("NCCL logs cover 4 of 16 ranks" in w for w in logs.warnings)
    assert logs.ring_order == [0, 5, 4, 7, 6, 3, 2, 1, 8, 13, 12, 15, 14, 11, 10, 9]
    # with hosts only (2.10-era "Init COMPLETE" lines, no localRanks) the logged ranks are all
    # there is: the traced ranks 0, 1 are not in this excerpt, so the trace's host_name decides
    b = analyze(
        _nccl_run(tmp_path / "b", ["nccl_issue629_init_complete_2hosts.log"], topology=False)
    )
    assert b.summary.topology.source == "host_name"
    # run.json, when it has a topology, wins over the logs
    c = analyze(_nccl_run(tmp_path / "c", ["nccl_issue1412_ib_2nodes_16ranks.log"]))
    assert c.summary.topology.source == "run.json"


@pytest.mark.corpus
def test_nccl_algorithms_chosen_and_run(tmp_path: Path) -> None:
    run = _nccl_run(tmp_path, ["nccl_issue1453_tuning_truncated_channels.log"], trace=NCCL_TRACE)
    a = analyze(run)
    nccl = a.summary.nccl
    tuning = read_nccl_logs(NCCL_LOGS / "nccl_issue1453_tuning_truncated_channels.log").tuning
    assert {(r.algo, r.proto) for r in nccl.logs.algorithms} == set(
        zip(tuning["algo"].to_list(), tuning["proto"].to_list())
    )
    assert nccl.kernel_algorithms["all_reduce"]["RING_LL"] > 0  # what the kernels ran
    tr = a.summary.traffic
    assert tr.backend == "nccl" and "ring" in tr.model["all_reduce"]


def test_ring_order_from_the_log_shapes_the_links() -> None:
    """16 ranks on 2 nodes, NCCL's ring 0 from a real log: 0 5 4 7 6 3 2 1 8 13 12 15 14 11 10 9."""
    log = read_nccl_logs(NCCL_LOGS / "nccl_issue1412_ib_2nodes_16ranks.log")
    ring = ring_order(log, 16)
    calls = pl.DataFrame(
        [
            {
                "call_id": "0#1",
                "group": "0",
                "group_desc": "default_pg",
                "dim": None,
                "seq": 1,
                "op": "all_reduce",
                "bytes": 1600,
                "ranks": list(range(16)),
                "group_size": 16,
                "src": None,
                "dst": None,
                "algorithm": "RING",
                "protocol": "LL",
                "device": "gpu",
                "complete": True,
                "transfer_ns": 1000,
                "start_ns": 0,
                "end_ns": 1000,
                "present": 16,
            }
        ]
    )
    model, warnings = model_calls(calls, "nccl", ring)
    assert warnings == [] and model["ring"][0].to_list() == ring
    links = {
        (r["src"], r["dst"])
        for r in link_bytes(model.drop("group", "group_desc", "dim")).to_dicts()
    }
    assert links == {(ring[i], ring[(i + 1) % 16]) for i in range(16)}
    assert (0, 5) in links and (0, 1) not in links  # the log's order, not rank order
    nodes = {r: r // 8 for r in range(16)}
    inter = [(a, b) for a, b in links if nodes[a] != nodes[b]]
    assert sorted(inter) == [(1, 8), (9, 0)]  # the ring crosses nodes twice
