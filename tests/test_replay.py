"""The pipeline replay against the papers' closed forms and against timelines worked out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit import theory
from tracekit.analyses.replay import replay
from tracekit.strategies.schedules import step_order as schedule_order
from tracekit.strategies.schedules import stream

TIMES = st.sampled_from([(1.0, 1.0), (1.0, 2.0), (0.25, 0.75), (3.0, 1.0)])


@settings(max_examples=150, deadline=None)
@given(
    schedule=st.sampled_from(["gpipe", "1f1b"]), p=st.integers(2, 8), m=st.integers(1, 16), fb=TIMES
)
def test_uniform_bubble_is_the_papers(schedule, p, m, fb):
    """Uniform stages: makespan (m+p-1)(f+b), bubble (p-1)/(m+p-1), whatever b/f is."""
    f, b = fb
    r = replay(schedule, p, m, f, b)
    assert r.makespan == pytest.approx((m + p - 1) * (f + b), rel=1e-12)
    assert abs(r.bubble_fraction - theory.pipeline_bubble_fraction(p, m)) <= 1e-12
    assert r.ops.height == 2 * p * m


@pytest.mark.parametrize("p", range(2, 9))
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 16])
def test_max_inflight(p, m):
    """GPipe holds all m microbatches' activations on every stage; 1F1B min(p-r, m) on stage r."""
    gpipe = replay("gpipe", p, m, 1.0, 2.0).per_stage
    one_f = replay("1f1b", p, m, 1.0, 2.0).per_stage
    assert gpipe["max_inflight"].to_list() == [m] * p
    assert one_f["max_inflight"].to_list() == [min(p - r, m) for r in range(p)]


def test_schedule_orders():
    assert schedule_order("gpipe", 2, 3, 0) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("B", 1),
        ("B", 2),
    ]
    assert schedule_order("gpipe", 2, 3, 1, backward_order="reverse")[3:] == [
        ("B", 2),
        ("B", 1),
        ("B", 0),
    ]
    # p=4, stage 1: warm-up p-r-1 = 2 forwards, steady 1F1B, cool-down 2 backwards
    assert schedule_order("1f1b", 4, 4, 1) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert schedule_order("1f1b", 4, 4, 3) == [
        ("F", 0),
        ("B", 0),
        ("F", 1),
        ("B", 1),
        ("F", 2),
        ("B", 2),
        ("F", 3),
        ("B", 3),
    ]
    assert schedule_order("pipedream", 4, 4, 1) == schedule_order("1f1b", 4, 4, 1)
    with pytest.raises(ValueError):
        schedule_order("zb-h1", 2, 2, 0)


def test_streams() -> None:
    """GPipe and 1F1B repeat one step's order per step; PipeDream's steps are one 1F1B stream:
    on stage 0 of p=2, m=2 step 1's first forward runs before step 0's last backward."""
    assert stream("1f1b", 2, 2, 0, 2) == [
        (k, s, j) for s in range(2) for k, j in schedule_order("1f1b", 2, 2, 0)
    ]
    assert stream("pipedream", 2, 2, 0, 2) == [
        ("F", 0, 0),
        ("F", 0, 1),
        ("B", 0, 0),
        ("F", 1, 0),
        ("B", 0, 1),
        ("F", 1, 1),
        ("B", 1, 0),
        ("B", 1, 1),
    ]


# p=2, m=2; stage 0: F=1, B=2; stage 1: F=3, B=1 (a slow last stage).
FWD = [[1, 1], [3, 3]]
BWD = [[2, 2], [1, 1]]


def timeline(result):
    return {
        (r["stage"], r["kind"], r["microbatch"]): (r["start"], r["end"])
        for r in result.ops.to_dicts()
    }


def test_gpipe_by_hand():
    """GPipe (torch order), worked out op by op:

    stage 0: F0 [0,1]  F1 [1,2]                     (no inputs to wait for)
    stage 1: F0 [1,4]  needs F(0,0) at 1
             F1 [4,7]  F(0,1) done at 2, stage busy until 4
             B0 [7,8]  last stage: only needs its own F0; stage free at 7
             B1 [8,9]
    stage 0: B0 [8,10]  needs B(1,0) at 8 (stage idle since 2)
             B1 [10,12] needs B(1,1) at 9, stage busy until 10
    window [0,12]; busy 6 and 8; idle 6 + 4 = 10; bubble 10 / (2 x 12) = 5/12.
    stage 0: fill 0, steady 6 (2..8), drain 0; stage 1: fill 1, steady 0, drain 3 (9..12).
    """
    r = replay("gpipe", 2, 2, FWD, BWD)
    assert timeline(r) == {
        (0, "F", 0): (0, 1),
        (0, "F", 1): (1, 2),
        (0, "B", 0): (8, 10),
        (0, "B", 1): (10, 12),
        (1, "F", 0): (1, 4),
        (1, "F", 1): (4, 7),
        (1, "B", 0): (7, 8),
        (1, "B", 1): (8, 9),
    }
    assert r.makespan == 12
    assert r.bubble_fraction == 10 / 24
    ps = r.per_stage.to_dicts()
    assert [(s["busy"], s["fill"], s["steady"], s["drain"]) for s in ps] == [
        (6, 0, 6, 0),
        (8, 1, 0, 3),
    ]


def test_gpipe_reverse_backward_by_hand():
    """Backwards in reverse order: stage 1 B1 [7,8], B0 [8,9]; stage 0 B1 [8,10], B0 [10,12]."""
    r = replay("gpipe", 2, 2, FWD, BWD, backward_order="reverse")
    t = timeline(r)
    assert (t[(1, "B", 1)], t[(1, "B", 0)], t[(0, "B", 1)], t[(0, "B", 0)]) == (
        (7, 8),
        (8, 9),
        (8, 10),
        (10, 12),
    )
    assert r.bubble_fraction == 10 / 24


def test_1f1b_by_hand():
    """1F1B: stage 0 warm-up 1 -> F0 F1 B0 B1; stage 1 warm-up 0 -> F0 B0 F1 B1.

    stage 0: F0 [0,1]  F1 [1,2]
    stage 1: F0 [1,4]  needs F(0,0) at 1
             B0 [4,5]  its own F0 done at 4
             F1 [5,8]  F(0,1) was ready at 2, stage busy until 5
             B1 [8,9]
    stage 0: B0 [5,7]  needs B(1,0) at 5
             B1 [9,11] needs B(1,1) at 9
    window [0,11]; busy 6 and 8; idle 5 + 3 = 8; bubble 8 / 22 = 4/11 < GPipe's 5/12:
    stage 1 starts its backwards early, so stage 0's first backward overlaps stage 1's F1.
    """
    r = replay("1f1b", 2, 2, FWD, BWD)
    assert timeline(r) == {
        (0, "F", 0): (0, 1),
        (0, "F", 1): (1, 2),
        (0, "B", 0): (5, 7),
        (0, "B", 1): (9, 11),
        (1, "F", 0): (1, 4),
        (1, "B", 0): (4, 5),
        (1, "F", 1): (5, 8),
        (1, "B", 1): (8, 9),
    }
    assert r.makespan == 11
    assert r.bubble_fraction == 8 / 22
    ps = r.per_stage.to_dicts()
    assert [(s["busy"], s["fill"], s["steady"], s["drain"], s["max_inflight"]) for s in ps] == [
        (6, 0, 5, 0, 2),
        (8, 1, 0, 2, 1),
    ]


@pytest.mark.parametrize("p,m,steps", [(2, 2, 3), (4, 4, 3), (4, 8, 2), (8, 4, 4)])
def test_pipedream_pays_fill_and_drain_once(p, m, steps):
    """No flush: one 1F1B stream of steps x m microbatches, bubble (p-1)/(steps m + p-1)."""
    pd = replay("pipedream", p, m, 1.0, 2.0, steps=steps)
    gpipe = replay("gpipe", p, m, 1.0, 2.0, steps=steps)
    assert pd.bubble_fraction < gpipe.bubble_fraction
    assert pd.bubble_fraction == pytest.approx((p - 1) / (steps * m + p - 1), abs=1e-12)
    # GPipe over several steps flushes every step: the same fraction as one step.
    assert gpipe.bubble_fraction == pytest.approx(theory.pipeline_bubble_fraction(p, m), abs=1e-12)
    assert gpipe.makespan == pytest.approx(steps * (m + p - 1) * 3.0)
    assert sorted(set(pd.ops["step"].to_list())) == list(range(steps))
    assert pd.ops.filter(pd.ops["step"] == steps - 1)["microbatch"].max() == m - 1


def test_per_stage_adds_up():
    r = replay("1f1b", 4, 6, [[1, 2, 1, 2, 1, 2], [2] * 6, 1.5, [1] * 6], 2.0)
    for s in r.per_stage.to_dicts():
        assert s["fill"] + s["busy"] + s["steady"] + s["drain"] == pytest.approx(r.makespan)


def test_bad_durations():
    with pytest.raises(ValueError):
        replay("gpipe", 2, 2, [[1, 1]], 1.0)
    with pytest.raises(ValueError):
        replay("gpipe", 2, 2, [[1], [1]], 1.0)
