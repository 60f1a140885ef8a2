"""Every committed sample run analyses cleanly, and what it shows matches the papers."""

from __future__ import annotations

import json

import pytest
from conftest import SAMPLES, run_cli
from corpus_reference import differences, rank_seconds

from tracekit.analysis import analyze
from tracekit.runfolder import is_run_folder

RUNS = sorted(p for p in SAMPLES.iterdir() if is_run_folder(p)) if SAMPLES.is_dir() else []


@pytest.mark.parametrize("run", RUNS, ids=[p.name for p in RUNS])
def test_sample_breakdown_recomputed_from_the_events(run):
    """Every rank's span, compute, comm, overlap, exposed comm, other and idle against the same
    numbers computed from the trace JSON in plain Python (tests/corpus_reference.py)."""
    result = analyze(run)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "ok"
    assert [r.rank for r in result.summary.ranks] == list(range(meta["world_size"]))
    ref = rank_seconds(sorted((run / "traces").glob("rank*.json.gz")))
    assert differences(result.summary.ranks, ref) == []
    for r in result.summary.ranks:
        assert r.comm_s > 0 and r.compute_s > 0 and r.idle_s >= 0
        assert 0 <= r.overlap_s <= min(r.comm_s, r.compute_s)
    assert result.summary.window.kind == "complete_steps"


def test_dp_sample_volume_and_memory_match_theory():
    run = SAMPLES / "dp"
    result = analyze(run)
    meta = json.loads((run / "run.json").read_text())
    psi, n = meta["config"]["params"], meta["world_size"]
    coll = result.summary.collectives
    # ring all-reduce of fp32 gradients: 2 Psi (n-1)/n elements per rank per step
    assert coll.ideal_bytes_per_rank_per_step == pytest.approx(2 * 4 * psi * (n - 1) / n, rel=1e-6)
    assert {op.op for op in coll.per_op} == {"all_reduce"}
    mem = result.summary.memory
    assert mem.theory.formula == "16Psi"
    for r in mem.per_rank:
        assert r.params_bytes == 4 * psi and r.grads_bytes == 4 * psi
        assert r.model_states_bytes == pytest.approx(mem.theory.model_states_bytes, rel=0.001)


def test_dp_sample_through_the_cli(tmp_path):
    proc = run_cli("analyze", str(SAMPLES / "dp"), "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["warnings"] == []
    assert "exposed" in proc.stdout
