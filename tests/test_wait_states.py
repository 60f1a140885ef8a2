"""Wait states, the breakdown with waiting as its own state, root causes and the critical path on
committed traces (the sample 1F1B pipeline, the DP sample, a one-rank trace) and the interval
arithmetic under them. The planted-straggler ground truth is tests/test_why.py (slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tracekit.analyses import intervals as iv
from tracekit.analysis import analyze

REPO = Path(__file__).resolve().parents[1]
PP = REPO / "sample_traces" / "pp-1f1b"
DP = REPO / "sample_traces" / "dp"


@pytest.fixture(scope="module")
def pp():
    return analyze(PP)


def test_interval_union_intersection_and_coverage() -> None:
    s, e = iv.union(np.array([5, 0, 2, 20]), np.array([8, 3, 4, 25]))
    assert s.tolist() == [0, 5, 20] and e.tolist() == [4, 8, 25]
    a, b = iv.intersect((s, e), (np.array([1, 22]), np.array([6, 30])))
    assert a.tolist() == [1, 5, 22] and b.tolist() == [4, 6, 25]
    assert iv.inside(s, e, np.array([0, 1, 10]), np.array([30, 7, 11])).tolist() == [12, 5, 0]
    # [0,4) [5,8) [20,25) less [1,6) [22,30): [0,1) [6,8) [20,22)
    m, n = iv.minus((s, e), (np.array([1, 22]), np.array([6, 30])))
    assert m.tolist() == [0, 6, 20] and n.tolist() == [1, 8, 22]
    assert (
        iv.minus((s, e), (np.array([], np.int64), np.array([], np.int64)))[0].tolist() == s.tolist()
    )


def test_pipeline_waiting_is_its_own_state_and_the_states_add_up(pp) -> None:
    states = pp.frame("rank_states")
    ranks = {r.rank: r for r in pp.summary.ranks}
    for row in states.iter_rows(named=True):
        total = sum(row[k] for k in ("compute_s", "transfer_s", "waiting_s", "other_s", "idle_s"))
        assert total == pytest.approx(row["span_s"], abs=1e-6)
        r = ranks[row["rank"]]
        # exposed communication = transfer + waiting; waiting is most of it in the 1F1B bubble
        assert row["transfer_s"] + row["waiting_s"] == pytest.approx(r.exposed_comm_s, abs=1e-6)
        assert row["waiting_s"] > 0.5 * r.exposed_comm_s
        assert row["transfer_s"] < 0.1 * r.exposed_comm_s


def test_pipeline_waits_are_late_senders_and_the_matrix_is_the_chain(pp) -> None:
    ws = pp.summary.why.wait_states
    assert ws.patterns[0].pattern == "late_sender"
    # every point-to-point wait is on a neighbouring stage (the step's loss broadcast waits on
    # stage 0, which ends last: a collective, not the chain)
    frame = pp.frame("wait_states")
    p2p = frame.filter(
        pl.col("pattern").is_in(["late_sender", "late_receiver"]) & (pl.col("wait_ns") > 0)
    )
    assert p2p.height > 0
    assert ((p2p["rank"] - p2p["last_rank"]).abs() == 1).all(), p2p
    assert abs(ws.pairs[0].waiter - ws.pairs[0].cause) == 1, ws.pairs[0]
    # the matrix counts blocked time once, as the root causes do, never more than the waiting
    assert sum(p.wait_s for p in ws.pairs) == pytest.approx(
        pp.summary.why.root_causes.wait_s, rel=1e-9
    )
    waiting = {r.rank: r.waiting_s for r in ws.per_rank}
    for w in waiting:
        assert sum(p.wait_s for p in ws.pairs if p.waiter == w) <= waiting[w] + 1e-9


def test_every_wait_is_charged_once(pp) -> None:
    rc = pp.summary.why.root_causes
    charged = sum(r.cost_s for r in rc.per_rank) + rc.before_trace_s
    assert charged == pytest.approx(rc.wait_s, rel=1e-6)
    assert rc.direct_s + rc.propagated_s == pytest.approx(rc.wait_s, rel=1e-6)
    assert rc.propagated_s > 0  # a stage late because it waited on its own neighbour


def test_the_pipeline_critical_path_crosses_every_stage_and_covers_the_steps(pp) -> None:
    path = pp.summary.why.critical_path
    assert {r.rank for r in path.per_rank} == {0, 1, 2, 3}
    assert sum(r.share for r in path.per_rank) == pytest.approx(1.0, abs=1e-6)
    steps = pp.frame("critical_path")
    # the pieces tile each step: no overlap, no gap
    for (_,), part in steps.sort("start_ns").partition_by("step", as_dict=True).items():
        assert (part["start_ns"][1:] == part["end_ns"][:-1]).all()


def test_wait_rows_follow_the_scalasca_definition() -> None:
    a = analyze(DP)
    w = a.frame("wait_states")
    assert w.height and (w["wait_ns"] >= 0).all()
    last = w.filter(pl.col("rank") == pl.col("last_rank"))
    assert (last["wait_ns"] == 0).all()
    both = w.filter(pl.col("rank") != pl.col("last_rank"))
    assert (both["wait_ns"] == (both["last_arrival_ns"] - both["start_ns"]).clip(0)).all()


def test_a_single_rank_trace_has_a_path_and_no_cross_rank_waits(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    (one / "rank0.json.gz").write_bytes((DP / "traces" / "rank0.json.gz").read_bytes())
    why = analyze(one).summary.why
    assert why.critical_path.note == "one rank: no cross-rank waits"
    assert why.wait_states.wait_s == 0 and why.top_cause is None
    assert why.diagnosis[0] == "one rank: no cross-rank waits"


def _ints(*pairs: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([a for a, _ in pairs], np.int64),
        np.array([b for _, b in pairs], np.int64),
    )


def test_a_wait_before_the_causes_trace_began_is_before_trace_not_its_ops() -> None:
    """Rank 1's trace starts at 100 (its profiler started later); rank 0 computed 5 ns and waits
    from 5 to 115 on it; rank 1 computes 15 ns (aten::mm) from 100. Of the 110 ns wait, 95 lie
    before rank 1 was traced (``before trace``: its reason is not in the trace); from 100, where
    both are traced, rank 1 computed 15 and rank 0 nothing: the op carries those 15."""
    from tracekit.analyses import root_causes as rc

    waits = pl.DataFrame(
        {
            "call_id": [0, 0],
            "rank": [0, 1],
            "start_ns": [5, 115],
            "done_ns": [120, 120],
            "last_rank": [1, 1],
            "last_arrival_ns": [115, 115],
            "wait_ns": [110, 0],
        }
    )
    none = _ints()
    sets = {
        0: {"compute": _ints((0, 5)), "comm": _ints((5, 120)), "waiting": _ints((5, 115)),
            "other": none, "idle": none},
        1: {"compute": _ints((100, 115)), "comm": _ints((115, 120)), "waiting": none,
            "other": none, "idle": none},
    }  # fmt: skip
    ops = {
        0: rc.Ops(["aten::mm"], np.array([0]), np.array([0]), np.array([5]), [None]),
        1: rc.Ops(["aten::mm"], np.array([0]), np.array([100]), np.array([115]), [None]),
    }
    causes, inst = rc.root_causes(waits, sets, ops, {0: 0, 1: 100})
    got = {(r, what): ns for r, what, _, _, ns in causes.iter_rows()}
    assert got == {(1, rc.BEFORE_TRACE): 95, (1, "aten::mm"): 15}
    assert inst["wait_ns"].sum() == sum(got.values())  # every wait charged once


def test_a_wait_beyond_its_causes_excess_is_late_start_not_its_ops() -> None:
    """Both traced from 0. Call A: both arrive at 0; rank 0 leaves it at 10, rank 1 at 100 (its
    transfer tail). Then rank 0 computes 5 and waits from 15; rank 1 computes 15 (aten::mm) and
    arrives at 115. The 100 ns wait is rank 1's later leaving of call A (90, ``late start``)
    plus its excess compute (15 - 5 = 10): the op carries 10, never the whole wait."""
    from tracekit.analyses import root_causes as rc

    waits = pl.DataFrame(
        {
            "call_id": [0, 0, 1, 1],
            "rank": [0, 1, 0, 1],
            "start_ns": [0, 0, 15, 115],
            "done_ns": [10, 100, 120, 120],
            "last_rank": [1, 1, 1, 1],
            "last_arrival_ns": [0, 0, 115, 115],
            "wait_ns": [0, 0, 100, 0],
        }
    )
    none = _ints()
    sets = {
        0: {"compute": _ints((10, 15)), "comm": _ints((0, 10), (15, 120)),
            "waiting": _ints((15, 115)), "other": none, "idle": none},
        1: {"compute": _ints((100, 115)), "comm": _ints((0, 100), (115, 120)), "waiting": none,
            "other": none, "idle": none},
    }  # fmt: skip
    ops = {
        0: rc.Ops(["aten::mm"], np.array([0]), np.array([10]), np.array([15]), [None]),
        1: rc.Ops(["aten::mm"], np.array([0]), np.array([100]), np.array([115]), [None]),
    }
    causes, inst = rc.root_causes(waits, sets, ops, {0: 0, 1: 0})
    got = {(r, what): ns for r, what, _, _, ns in causes.iter_rows()}
    assert got == {(1, "late start"): 90, (1, "aten::mm"): 10}
    assert inst["wait_ns"].sum() == sum(got.values())  # every wait charged once
