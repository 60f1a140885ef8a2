"""summary.json ``contention`` and ``steps`` from a run folder's files (#27), fast: the committed
dp sample run with contention files written here, so the expected figures are the files' own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from tracekit import runfolder
from tracekit.analyses.contention import step_times
from tracekit.analysis import analyze

ROOT = Path(__file__).resolve().parents[1]
DP = ROOT / "sample_traces" / "dp"


def _run_with(tmp_path: Path, files: dict[int, object]) -> Path:
    run = tmp_path / "dp"
    shutil.copytree(DP, run)
    for rank, data in files.items():
        path = runfolder.contention_path(run, rank)
        path.parent.mkdir(exist_ok=True)
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return run


def _file(wall: list[float], wait: list[float]) -> dict:
    steps = [
        {"step": k + 1, "wall_s": a, "cpu_wait_s": b} for k, (a, b) in enumerate(zip(wall, wait))
    ]
    total = {"wall_s": sum(wall), "cpu_wait_s": sum(wait), "cpu_s": 0.5 * sum(wall)}
    return {"schema": 1, "steps": steps, "total": total, "threads": 2, "local_ranks": 2,
            "machine": {"cores": 2}, "pinned": [0], "usable_cores": [0]}  # fmt: skip


def test_shares_warning_and_table_come_from_the_files(tmp_path: Path) -> None:
    run = _run_with(tmp_path, {0: _file([0.1, 0.3], [0.01, 0.09]), 1: _file([0.2, 0.2], [0, 0])})
    s = analyze(run).summary
    c = s.contention
    assert c is not None and [r.rank for r in c.per_rank] == [0, 1]
    r0, r1 = c.per_rank
    assert r0.cpu_wait_share == pytest.approx(0.1 / 0.4)
    assert r0.step_share_max == pytest.approx(0.3)
    assert r0.cpu_per_wall == pytest.approx(0.5) and r0.pinned is True and r0.threads == 2
    assert r1.cpu_wait_share == 0.0 and c.inflated == [0]
    assert c.cpu_wait_share_max == pytest.approx(0.25)
    assert c.cpu_wait_outside_share_max is None  # files from before the split: unknown, not 0
    (line,) = [w for w in s.warnings if w.startswith("contention: ")]
    assert "rank(s) 0 (25%)" in line and "2 ranks x 2 threads on 2 cores" in line
    assert "1 (" not in line


def test_nothing_measured_is_absent_never_zero(tmp_path: Path) -> None:
    """No file: no section. A file with figures that are not finite non-negative numbers:
    those figures are null, and no warning claims a share."""
    assert analyze(_run_with(tmp_path / "a", {})).summary.contention is None
    bad = {"total": {"wall_s": "x", "cpu_wait_s": -1, "cpu_s": float("nan")}, "steps": [7, {}]}
    s = analyze(_run_with(tmp_path / "b", {0: bad, 1: "not json{"})).summary
    assert s.contention is not None and len(s.contention.per_rank) == 1
    row = s.contention.per_rank[0]
    assert (row.wall_s, row.cpu_wait_s, row.cpu_wait_share, row.cpu_per_wall) == (None,) * 4
    assert s.contention.cpu_wait_share_max is None and s.contention.inflated == []
    assert not [w for w in s.warnings if w.startswith("contention: ")]


def test_step_time_is_the_job_span_of_each_step_every_rank_has() -> None:
    markers = pl.DataFrame(
        {
            "rank": [0, 1, 0, 1, 0],
            "step": [1, 1, 2, 2, 3],  # step 3: rank 1 lacks it
            "start_ns": [0, 10, 100, 90, 300],
            "end_ns": [50, 80, 200, 260, 400],
        }
    )
    assert step_times(markers) == pytest.approx([80e-9, 170e-9])


def test_the_sample_runs_steps_and_their_spread() -> None:
    s = analyze(DP).summary
    assert s.steps is not None and s.steps.steps == s.window.steps
    st = s.steps
    assert st.min_s <= st.median_s <= st.max_s
    assert st.spread == pytest.approx((st.max_s - st.min_s) / st.median_s)


def test_compare_ranks_runs_only_outside_their_noise() -> None:
    """Two runs whose step ranges overlap cannot be ranked: "within noise"; a run whose every
    step is slower than the fastest run's slowest: its excess over the fastest."""
    import msgspec

    from tracekit.figures import compare_rows
    from tracekit.report import compare_table

    s = analyze(DP).summary
    assert s.steps is not None and s.ranks[0].step_time_s is not None
    lo, hi = s.steps.min_s, s.steps.max_s

    def slower(factor: float):
        steps = msgspec.structs.replace(s.steps, min_s=lo * factor, max_s=hi * factor)
        ranks = [msgspec.structs.replace(r, step_time_s=r.step_time_s * factor) for r in s.ranks]
        return msgspec.structs.replace(s, steps=steps, ranks=ranks)

    far = 1.01 * hi / lo  # the slower run's shortest step beyond the fastest's longest
    rows = compare_rows([("a", s), ("same", slower(1.0 + 1e-9)), ("far", slower(far))])
    assert [r["vs_fastest"] for r in rows] == ["fastest", "within noise", f"+{far - 1:.0%}"]
    _, head, table = compare_table([("a", s), ("far", slower(far))])
    assert table[1][head.index("vs fastest")] == f"+{far - 1:.0%}"
    assert table[0][head.index("waited for a CPU")] == "–"  # the sample has no contention files


def test_the_corun_slowdown_comes_from_the_files_and_warns_above_its_bound(tmp_path: Path) -> None:
    """The co-run probe's figure per rank (tracekit.capture.corun), its maximum, the warning that
    names the slowed ranks, the table's column and the what-if's caveat; out-of-range values are
    unknown, never a figure."""
    from tracekit import prediction

    a, b = _file([0.2, 0.2], [0, 0]), _file([0.2, 0.2], [0, 0])
    a["corun"], b["corun"] = {"slowdown": 1.9}, {"slowdown": 1.05}
    s = analyze(_run_with(tmp_path / "slow", {0: a, 1: b})).summary
    assert s.contention is not None
    assert [r.corun_slowdown for r in s.contention.per_rank] == [1.9, 1.05]
    assert s.contention.corun_slowdown_max == 1.9
    (line,) = [w for w in s.warnings if w.startswith("contention (co-run): ")]
    assert "rank(s) 0 (1.9x)" in line and "1 (" not in line
    assert "1.9x" in (prediction.corun_caveat(s.contention.corun_slowdown_max) or "")
    from tracekit.report.tables import contention_table

    _, head, rows = contention_table(s)
    assert [r[head.index("co-run slowdown")] for r in rows] == ["1.90x", "1.05x"]
    b["corun"] = {"slowdown": 1.2}
    a["corun"] = {"slowdown": 1.1}
    calm = analyze(_run_with(tmp_path / "calm", {0: a, 1: b})).summary
    assert not [w for w in calm.warnings if "co-run" in w]
    assert prediction.corun_caveat(calm.contention.corun_slowdown_max) is None
    for bad in (0, -1.5, "2", True, None, 1e9):
        a["corun"] = {"slowdown": bad}
        odd = analyze(_run_with(tmp_path / f"bad{bad}", {0: a})).summary
        assert odd.contention.per_rank[0].corun_slowdown is None, bad
        assert odd.contention.corun_slowdown_max is None
