"""``tracekit predict --without-straggler`` / ``--rank-speed``: by hand, and on the real samples.

The check against runs with a planted straggler is tests/test_straggler_validation.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SAMPLES, run_cli

from tracekit import prediction as P
from tracekit.analyses import straggler_replay as sr
from tracekit.analyses.network_program import Call, Item, Program
from tracekit.analysis import analyze
from tracekit.errors import TracekitError

MS = 1_000_000


def _rank(rank: int, post: int, end: int, blocked: tuple[int, int]) -> Program:
    """Work until ``post``, one synchronous all_reduce (blocked over ``blocked``), work to end."""
    items = [
        Item("mark", 0, key=(0, "start")),
        Item("post", post, "c", span_start_ns=post, span_end_ns=blocked[1], thread="g"),
        Item("wait", post, "c"),
        Item("mark", end, key=(0, "end")),
    ]
    return Program(rank, 0, end, items, [blocked] if blocked[1] > blocked[0] else [])


def _two_ranks() -> tuple[dict[int, Program], dict[str, Call]]:
    # measured: rank 0 works 10 ms, then waits for rank 1, which works 30 ms; 1 ms transfer;
    # both work 10 ms more: the step is 41 ms
    calls = {"c": Call("c", "all_reduce", [0, 1], 0, 1 * MS, end_offset_ns={0: MS, 1: MS})}
    progs = {
        0: _rank(0, 10 * MS, 41 * MS, (10 * MS, 31 * MS)),
        1: _rank(1, 30 * MS, 41 * MS, (30 * MS, 31 * MS)),
    }
    return progs, calls


def test_a_faster_rank_by_hand() -> None:
    progs, calls = _two_ranks()
    assert sr.what_if(progs, calls, {}, None)["step_time_s"] == pytest.approx(0.041)
    # rank 1 three times as fast: it posts at 10 ms, the call ends at 11, rank 0 ends at 21
    assert sr.what_if(progs, calls, {1: 3.0}, None)["step_time_s"] == pytest.approx(0.021)
    # slower: 0.5 x doubles its 40 ms of work; rank 0 waits for it until 61 ms, ends at 71
    assert sr.what_if(progs, calls, {1: 0.5}, None)["step_time_s"] == pytest.approx(0.081, abs=1e-4)


def test_without_the_straggler_by_hand() -> None:
    """Rank 1's work is 40 ms a step, rank 0's 20 (window speed 2), but all of its excess lies
    before the call: 30 ms of work against rank 0's 10 there (s = 3), 10 against 10 after it
    (s = 1). Interval by interval, rank 1 posts at 10 ms, the call ends at 11 and both end at
    21 ms: the step without the excess. (One window-wide speed 2 posted at 15 and ended at 26.)"""
    progs, calls = _two_ranks()
    got = sr.without(progs, calls, 1, {0: 0.020, 1: 0.040})
    assert got is not None and got["speed"] == pytest.approx(2.0)
    assert got["intervals"] == 2
    assert got["step_time_s"] == pytest.approx(0.021)
    assert got["replayed_step_time_s"] == pytest.approx(0.041)
    assert got["measured_step_time_s"] == pytest.approx(0.041)
    # no excess (it did less than its peer): nothing removed
    none = sr.without(progs, calls, 0, {0: 0.020, 1: 0.040})
    assert none is not None and none["step_time_s"] == pytest.approx(0.041)


@pytest.mark.parametrize(
    "text", ["1", "1:0", "1:-2", "x:2", "1:nan", "1:inf", "1:3:2", "1:1:2:3", "-1:2"]
)
def test_bad_rank_speeds(text: str) -> None:
    with pytest.raises(TracekitError, match="--rank-speed"):
        P.parse_rank_speed(text)


def test_the_sample_what_if_is_the_why_sections() -> None:
    """One definition: predict --without-straggler gives summary.json why.what_if's step, and
    a curve's steps fall as the rank speeds up."""
    a = analyze(SAMPLES / "dp")
    try:
        wi = a.summary.why.what_if
        m = P.build(a)
    finally:
        a.close()
    assert wi is not None and wi.rank == a.summary.why.top_cause and wi.step_s is not None
    block = P.straggler_block(m, True, [(wi.rank, 1.0, 3.0)])
    assert block["without_straggler"]["step_time_s"] == pytest.approx(wi.step_s)
    assert block["without_straggler"]["speed"] == pytest.approx(wi.speed)
    assert wi.step_s <= block["replayed_step_time_s"]
    steps = [p["step_time_s"] for p in block["curve"]["points"]]
    assert steps[0] == pytest.approx(block["replayed_step_time_s"])  # speed 1: as replayed
    assert all(b <= a + 1e-9 for a, b in zip(steps, steps[1:])) and steps[-1] < steps[0]


def test_cli_writes_the_straggler_block(tmp_path: Path) -> None:
    dp = str(SAMPLES / "dp")
    res = run_cli(
        "predict", dp, "--without-straggler", "--rank-speed", "1:1.5", "--out", str(tmp_path)
    )
    assert res.returncode == 0, res.stderr
    assert "without rank 1's excess" in res.stdout and "with rank 1 x1.5" in res.stdout
    st = json.loads((tmp_path / "prediction.json").read_text())["straggler"]
    assert st["without_straggler"]["rank"] == 1
    assert st["rank_speeds"]["speeds"] == [{"rank": 1, "speed": 1.5}]
    bad = run_cli("predict", dp, "--rank-speed", "7:2", "--out", str(tmp_path / "b"))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "rank 7 is not one of the run's ranks" in bad.stderr
    assert not (tmp_path / "b").exists()


def test_a_call_done_before_its_wait_holds_from_the_wait_not_from_its_end() -> None:
    """Rank 0 needs the call at 30 ms, long after it ended (11 ms), and was held 5 ms there
    (``hold_ns``): the replay keeps those 5 ms from the wait on, and a later end inside the
    slack (rank 1 slower) costs nothing; a lag counted from the call's end would have."""
    calls = {"c": Call("c", "all_reduce", [0, 1], 0, 1 * MS, end_offset_ns={0: MS, 1: MS})}

    def prog(rank: int, post: int, wait: int, hold: int, end: int) -> Program:
        items = [
            Item("mark", 0, key=(0, "start")),
            Item("post", post, "c", span_start_ns=post, span_end_ns=post + MS, thread="g"),
            Item("wait", wait, "c", hold_ns=hold),
            Item("mark", end, key=(0, "end")),
        ]
        return Program(rank, 0, end, items, [(wait, wait + hold)] if hold else [])

    progs = {
        0: prog(0, 10 * MS, 30 * MS, 5 * MS, 45 * MS),
        1: prog(1, 10 * MS, 11 * MS, 0, 45 * MS),
    }
    assert sr.what_if(progs, calls, {}, None)["step_time_s"] == pytest.approx(0.045)
    # rank 1 twice as slow: it posts at 20 ms, the call ends at 21, still before rank 0's wait
    slow = sr.replay_at(progs, calls, {1: 0.5}, None)
    assert slow.step_time_s[0] == pytest.approx(0.045)
