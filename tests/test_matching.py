"""Process-group attribution and cross-rank matching on real gloo runs (and a real NCCL trace).

One real 4-rank gloo job (tests/groups_job.py: "row" groups {0,1}, {2,3} and "col" groups
{0,2}, {1,3}, p2p, a barrier, rank 1 late to the row all_reduce) is analysed once per module;
the committed 2-rank DP sample covers the no-dump fallback.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import groups_job as job
import polars as pl
import pytest
from builders.traces import NCCL_DATA
from conftest import torchrun

from tracekit import runfolder
from tracekit.analyses.groups import match_entries
from tracekit.analyses.matching import best_shift
from tracekit.analysis import analyze
from tracekit.ingest.flight_recorder import read_flight_records

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DP = REPO / "sample_traces" / "dp"
NCCL_TRACE = NCCL_DATA
S = job.ELEMS * 4  # bytes of the job's float32 tensor


@pytest.fixture(scope="module")
def groups_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("groups") / "groups-run"
    run.mkdir()
    torchrun(REPO / "tests" / "groups_job.py", run, nproc=4, timeout=600)
    return run


@pytest.fixture(scope="module")
def groups_analysis(groups_run: Path):
    return analyze(groups_run)


def _groups(run: Path) -> dict[str, dict]:
    return {
        g["name"]: g
        for g in runfolder.load_run_json(run)["config"]["strategy_options"]["process_groups"]
    }


def test_every_gloo_call_gets_its_group_from_the_flight_recorder(
    groups_run: Path, groups_analysis
) -> None:
    table = groups_analysis.collectives
    assert set(table["group_source"].unique()) == {"flight_recorder", "p2p"}
    named = _groups(groups_run)
    for row in table.filter(pl.col("group_source") == "flight_recorder").iter_rows(named=True):
        if row["group"] == "0":  # the world group: the barrier
            assert row["op"] == "barrier" and row["group_ranks"] == [0, 1, 2, 3]
            continue
        g = named[row["group"]]
        assert (
            row["rank"] in g["ranks"]
            and row["group_ranks"] == g["ranks"]
            and row["dim"] == g["dim"]
        )
    # each (rank, group, seq) is a real flight-recorder entry of a compatible op
    entries = pl.concat([r.entries for r in read_flight_records(groups_run)])
    fr = {
        (e["rank"], e["pg_name"], e["collective_seq_id"]): e["op"]
        for e in entries.iter_rows(named=True)
    }
    for row in table.filter(pl.col("group_source") == "flight_recorder").iter_rows(named=True):
        fr_op = fr[(row["rank"], row["group"], row["group_seq"])]
        assert fr_op == ("all_reduce" if row["op"] == "reduce_scatter" else row["op"])


def test_calls_per_group_are_counted_from_the_events(groups_analysis) -> None:
    per_group = {(r.group, r.op): r for r in groups_analysis.summary.collectives.per_group}
    steps = job.STEPS
    expected = {
        ("1", "all_reduce"),
        ("1", "all_gather"),
        ("1", "reduce_scatter"),
        ("2", "all_reduce"),
        ("2", "all_gather"),
        ("2", "reduce_scatter"),
        ("3", "all_reduce"),
        ("3", "broadcast"),
        ("4", "all_reduce"),
        ("4", "broadcast"),
        ("0", "barrier"),
        ("p2p 0->1", "send"),
        ("p2p 3->2", "send"),
    }
    assert set(per_group) == expected
    for key, r in per_group.items():
        assert r.count == steps, key  # calls, not rank rows
        assert r.complete_calls == steps
        assert r.rank_rows == steps * (4 if key[0] == "0" else 2)
    assert (
        per_group[("1", "all_reduce")].dim == "row" and per_group[("3", "broadcast")].dim == "col"
    )
    assert per_group[("1", "all_gather")].desc == "row0"


def test_transfer_is_the_shortest_span_and_the_rest_is_wait(groups_analysis) -> None:
    """A collective's transfer is its shortest span; a send and its recv: their overlap."""
    m = groups_analysis.frames["collective_matches"]
    assert m.height == groups_analysis.collectives.height and m["complete"].all()
    per_call = (
        m.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur"))
        .group_by("call_id")
        .agg(
            pl.col("dur").min().alias("shortest"),
            (pl.col("end_ns").min() - pl.col("start_ns").max()).clip(0).alias("overlap"),
            pl.col("op").is_in(["send", "recv"]).all().alias("p2p"),
            pl.col("transfer_ns").n_unique().alias("one"),
            pl.col("transfer_ns").first(),
            pl.col("wait_ns").min().alias("least_wait"),
        )
    )
    assert (per_call["one"] == 1).all()
    coll, p2p = per_call.filter(~pl.col("p2p")), per_call.filter(pl.col("p2p"))
    assert coll.height and p2p.height
    assert (coll["transfer_ns"] == coll["shortest"]).all()
    assert (p2p["transfer_ns"] == p2p["overlap"]).all()
    assert (coll["least_wait"] == 0).all()  # the last to arrive waits for no one
    assert ((m["transfer_ns"] + m["wait_ns"]) == (m["end_ns"] - m["start_ns"])).all()
    # rank 1 sleeps before every row all_reduce: rank 0 waits for it, rank 1 does not
    row_ar = m.filter((pl.col("group") == "1") & (pl.col("op") == "all_reduce"))
    w0 = row_ar.filter(pl.col("rank") == 0)["wait_ns"].median()
    w1 = row_ar.filter(pl.col("rank") == 1)["wait_ns"].median()
    assert w0 > 0.5 * job.SLEEP_S * 1e9 > w1


def test_sizes_the_trace_lacks_come_from_the_dumps(groups_analysis) -> None:
    t = groups_analysis.collectives
    ag = t.filter(pl.col("op") == "all_gather")
    assert ag.height and (ag["bytes"] == 2 * S).all()  # the all-gather output, S of nccl-tests
    rs = t.filter(pl.col("op") == "reduce_scatter")
    assert (
        (rs["wire_op"] == "all_reduce").all()
        and (rs["bytes"] == S).all()
        and (rs["wire_bytes"] == S).all()
    )


def test_busbw_per_op_and_per_group_from_transfer_times(groups_analysis) -> None:
    co = groups_analysis.summary.collectives
    m = groups_analysis.frames["collective_matches"]
    calls = m.unique("call_id")
    per_op = {r.op: r for r in co.per_op}
    for op, factor in (("all_reduce", 1.0), ("all_gather", 0.5), ("broadcast", 1.0)):  # n = 2
        c = calls.filter(pl.col("op") == op)
        algbw = c["bytes"].sum() / (c["transfer_ns"].sum() * 1e-9) / 1e9
        assert per_op[op].time_basis == "transfer"
        assert per_op[op].algbw_gbps == pytest.approx(algbw)
        assert per_op[op].busbw_gbps == pytest.approx(algbw * factor)
        assert per_op[op].transfer_s + per_op[op].wait_s == pytest.approx(per_op[op].time_s)
    for r in co.per_group:
        c = calls.filter(
            (pl.col("call_id").str.starts_with(f"{r.group}#")) & (pl.col("op") == r.op)
        )
        if r.group.startswith("p2p") or r.op == "barrier":
            continue
        algbw = c["bytes"].sum() / (c["transfer_ns"].sum() * 1e-9) / 1e9
        factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}[
            r.op
        ]
        assert r.busbw_gbps == pytest.approx(algbw * factor), r


def test_bytes_per_parallel_dimension(groups_analysis) -> None:
    tr = groups_analysis.summary.traffic
    by_dim = {r.dim: r for r in tr.by_dim}
    assert by_dim["row"].inter == 0 and by_dim["row"].intra > 0  # rows live inside a node
    assert by_dim["col"].intra == 0 and by_dim["col"].inter > 0  # columns cross nodes
    steps = job.STEPS
    # col: all_reduce 2(n-1)/n S x n ranks = 2S, broadcast S (one edge): 3S per call pair, two groups
    assert by_dim["col"].bytes == steps * 2 * (2 * S + S)
    assert tr.per_step.inter_node_bytes * steps == pytest.approx(tr.inter_node_bytes)
    assert tr.intra_node_bytes + tr.inter_node_bytes == tr.total_bytes


def test_without_dumps_one_group_from_pg_config(tmp_path: Path) -> None:
    """The DP sample without nccl/: its trace's pg_config lists one group, which is exact."""
    with_dumps = analyze(SAMPLE_DP)
    run = tmp_path / "dp"
    shutil.copytree(SAMPLE_DP, run, ignore=shutil.ignore_patterns("nccl", "analysis"))
    without = analyze(run)
    t = without.collectives
    assert set(t["group_source"]) == {"pg_config"} and set(t["group"]) == {"0"}
    assert t["complete"].all()
    a = with_dumps.collectives.sort("rank", "start_ns")["transfer_ns"].to_list()
    b = t.sort("rank", "start_ns")["transfer_ns"].to_list()
    assert a == b  # same calls matched, same transfer times


def test_without_dumps_several_groups_warns(groups_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "groups"
    shutil.copytree(groups_run, run, ignore=shutil.ignore_patterns("nccl", "analysis"))
    a = analyze(run)
    assert any(
        "no flight-recorder dump" in w and "not matched across ranks" in w
        for w in a.summary.warnings
    )
    coll = a.collectives.filter(pl.col("group_source") != "p2p")
    # each rank is in three groups: a guess would pair calls of different groups, so none is made
    assert set(coll["group_source"]) == {"unknown"} and coll["group"].null_count() == coll.height
    assert not coll["complete"].any()
    per_op = {r.op: r for r in a.summary.collectives.per_op}
    assert per_op["all_reduce"].time_basis == "duration" and per_op["all_reduce"].transfer_s is None
    assert per_op["send"].time_basis == "transfer"  # p2p is matched by (src, dst, k) regardless


@pytest.mark.corpus
def test_nccl_trace_names_its_group_and_algorithm() -> None:
    """A real NCCL trace (rank 0 of 2): the group comes from record_param_comms, the algorithm
    from the kernel name; rank 1 is missing, so there is no transfer/wait split."""
    a = analyze(NCCL_TRACE)
    t = a.collectives
    assert set(t["group_source"].drop_nulls()) == {"trace"} and set(t["group"]) == {"0"}
    assert t["group_ranks"][0].to_list() == [0, 1] and not t["complete"].any()
    assert set(t["algorithm"]) == {"RING"} and set(t["protocol"]) == {"LL"}
    per_op = {r.op: r for r in a.summary.collectives.per_op}
    assert per_op["all_reduce"].time_basis == "duration" and per_op["all_reduce"].transfer_s is None
    assert a.summary.nccl.kernel_algorithms["all_reduce"] == {"RING_LL": per_op["all_reduce"].count}
    assert a.summary.collectives.per_group[0].group == "0"


def test_match_entries_rule() -> None:
    """Containment, the near-next rule, a missing entry, and reduce_scatter recorded as all_reduce."""

    def call(op, a, b):
        return {"op": op, "call_start_ns": a, "call_end_ns": b}

    def entry(op, t):
        return {"op": op, "time_created_ns": t}

    calls = [
        call("all_reduce", 0, 100),
        call("reduce_scatter", 1_000, 1_100),
        call("all_gather", 200_000, 200_050),
        call("all_gather", 200_060, 200_200),
    ]
    entries = [entry("all_reduce", 50), entry("all_reduce", 1_050), entry("all_gather", 200_150)]
    # the last entry lies inside the 4th call: the 3rd call (its entry lost) must not take it
    assert match_entries(calls, entries) == [0, 1, None, 2]
    assert match_entries(calls[:1], [entry("broadcast", 50)]) == [None]


@pytest.mark.parametrize("sample", ["pp-gpipe", "pp-pipedream"])
def test_p2p_pairs_are_causal(sample: str) -> None:
    """Every matched send/recv pair of a real pipeline run: the recv ends after the send was
    posted. Asynchronous PipeDream keeps activations in flight across steps, so a rank's trace
    can start with a recv whose send predates the sender's trace: the order is shifted, not 0."""
    a = analyze(REPO / "sample_traces" / sample)
    t = a.collectives.filter(pl.col("op").is_in(["send", "recv"]) & pl.col("complete"))
    assert t.height > 0
    sends = t.filter(pl.col("op") == "send").select(
        "call_id", pl.col("call_start_ns").alias("posted")
    )
    recvs = t.filter(pl.col("op") == "recv").select("call_id", pl.col("end_ns").alias("arrived"))
    pairs = sends.join(recvs, on="call_id")
    assert pairs.height == sends.height == recvs.height
    assert (pairs["arrived"] >= pairs["posted"]).all()
    if sample == "pp-gpipe":  # a flush every step: nothing in flight at the window's edges
        p2p = a.collectives.filter(pl.col("op").is_in(["send", "recv"]))
        assert p2p["complete"].all()


def test_best_shift() -> None:
    sends = [(100, 110), (200, 210), (300, 310)]
    assert best_shift(sends, [(90, 120), (190, 220), (290, 320)]) == 0
    # the first recv's send came before the sender's trace: recv j pairs with send j - 1
    assert best_shift(sends, [(0, 50), (90, 120), (190, 220), (290, 320)]) == -1
