"""Scale controls: ``--ranks`` by distributedInfo (read from each file's head, not a parse) and
``--sample N`` (a sampled overview of a big job). Correctness only; speed is benchmarks/run.py's.

The job: a real GPU trace (trace_filter rank 0, torch profiler, NCCL) replicated into six ranks
whose file names say nothing (``host_<letter>.json.gz``), distributedInfo renumbered 0..5.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import HTA, run_cli, spy_parses

from tracekit.analysis import analyze
from tracekit.ingest.kineto_info import peek_distributed_info, peek_rank
from tracekit.ingest.selection import select, spread

SOURCE = HTA / "trace_filter" / "sampled_rank-0.json.gz"
WORLD = 6


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("job")
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    for r in range(WORLD):
        dist = {**doc["distributedInfo"], "rank": r, "world_size": WORLD}
        # Kineto's order: distributedInfo before the events (what the head peek relies on)
        text = json.dumps(
            {
                **{k: v for k, v in doc.items() if k != "distributedInfo"},
                "distributedInfo": dist,
                "traceEvents": events,
            }
        )
        (folder / f"host_{'abcdef'[r]}.json.gz").write_bytes(gzip.compress(text.encode(), 1))
    return folder


@pytest.mark.corpus
def test_peek_reads_the_rank_from_the_head_of_real_traces(job):
    assert peek_rank(HTA / "trace_filter" / "sampled_rank-1.json.gz") == 1
    assert peek_rank(HTA / "nccl_parser_config" / "nccl_data.json.gz") == 0
    assert peek_rank(next((HTA / "cpu_only").glob("*.json.gz"))) == 34
    assert peek_rank(next((HTA / "amd_trace").glob("*.json.gz"))) is None  # no distributedInfo
    assert (
        peek_distributed_info(HTA / "nccl_parser_config" / "nccl_data.json.gz")["pg_config"][0][
            "pg_size"
        ]
        == 2
    )
    assert [peek_rank(f) for f in sorted(job.iterdir())] == list(range(WORLD))


def test_peek_of_plain_json_and_of_damaged_files(tmp_path):
    plain = tmp_path / "t.json"
    plain.write_text(
        '{"distributedInfo": {"rank": 7, "note": "a } and a \\" inside"}, "traceEvents": []}'
    )
    assert peek_rank(plain) == 7
    cut = tmp_path / "cut.json"
    cut.write_text('{"distributedInfo": {"rank": 7, "world')
    assert peek_rank(cut) is None
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert peek_rank(bad) is None
    assert peek_rank(tmp_path / "missing.json") is None


@pytest.mark.corpus
def test_ranks_select_by_distributed_info_without_parsing_the_others(job, monkeypatch):
    parsed = spy_parses(monkeypatch)
    result = analyze(job, ranks=[1, 4], cache=False)
    assert [r.rank for r in result.summary.ranks] == [1, 4]
    assert sorted(p.name for p in parsed) == ["host_b.json.gz", "host_e.json.gz"]
    assert set(result.events["rank"].unique()) == {1, 4}
    assert result.summary.sampling is None


@pytest.mark.corpus
def test_sample_spreads_over_the_job_and_says_so(job, monkeypatch):
    parsed = spy_parses(monkeypatch)
    result = analyze(job, sample=3, cache=False)
    assert [r.rank for r in result.summary.ranks] == [0, 3, 5]  # first, middle, last
    assert len(parsed) == 3
    sampling = result.summary.sampling
    assert sampling.ranks == [0, 3, 5] and sampling.ranks_present == WORLD
    (note,) = [w for w in result.summary.warnings if w.startswith("sampled overview")]
    assert "3 of 6 ranks" in note and "0, 3, 5" in note
    # no "ranks ... have no trace" complaint about the ranks left out on purpose
    assert not [w for w in result.summary.warnings if "have no trace" in w or "has no trace" in w]


@pytest.mark.corpus
def test_sample_and_ranks_together_and_cli(job, tmp_path):
    sel = select(sorted(job.iterdir()), ranks=[1, 2, 3, 4, 5], sample=2)
    assert sel.sampled == [1, 5] and [f.name for f in sel.files] == [
        "host_b.json.gz",
        "host_f.json.gz",
    ]
    out = tmp_path / "sampled"
    proc = run_cli("analyze", str(job), "--sample", "2", "--out", str(out), "--no-cache")
    assert proc.returncode == 0, proc.stderr
    assert "sampled overview: 2 of 6 ranks" in proc.stderr.replace("\n", " ")
    summary = json.loads((out / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 5]
    assert run_cli("analyze", str(job), "--sample", "0").returncode == 2


def test_spread_of_a_thousand_ranks():
    ranks = list(range(0, 2048, 2))  # 1024 ranks, not numbered 0..n-1
    chosen = spread(ranks, 16)
    assert len(chosen) == 16 and chosen[0] == 0 and chosen[-1] == 2046
    gaps = [b - a for a, b in zip(chosen, chosen[1:])]
    assert max(gaps) - min(gaps) <= 2, "evenly spaced (to one rank)"
    assert spread(ranks, 1) == [0]
    assert spread([3, 1, 2], 10) == [1, 2, 3]


@pytest.mark.corpus
def test_files_that_say_their_rank_only_inside_are_read_then_filtered(tmp_path, monkeypatch):
    """No distributedInfo in the head (it comes after the events) and no rank in the name: the
    file must be parsed to learn its rank; --ranks still gives exactly the ranks asked for."""
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    for r in range(2):
        late = {
            "traceEvents": doc["traceEvents"],
            "distributedInfo": {**doc["distributedInfo"], "rank": r, "world_size": 2},
        }
        (tmp_path / f"job_{r}.json.gz").write_bytes(gzip.compress(json.dumps(late).encode(), 1))
    assert peek_rank(tmp_path / "job_0.json.gz") is None  # 64 KB of events first
    parsed = spy_parses(monkeypatch)
    result = analyze(tmp_path, ranks=[1], cache=False)
    assert [r.rank for r in result.summary.ranks] == [1]
    assert len(parsed) == 2
