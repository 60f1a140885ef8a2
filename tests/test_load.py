"""tracekit.ingest.load: a run folder read once into a Job, per rank and for the job.

Checked against the files themselves (run.json, memory/rank<R>.json, the flight-recorder dumps,
the NCCL logs), and by analysing a Job whose folder is gone: the analyses read no file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES

from tracekit import runfolder
from tracekit.analyses.prepare import prepare
from tracekit.analysis import analyze, assemble, run_sections
from tracekit.ingest.flight_recorder import read_flight_record
from tracekit.ingest.load import assemble as assemble_job
from tracekit.ingest.load import load, load_rank, locate, read_selected
from tracekit.ingest.nccl_log import rank_layout, read_nccl_logs, ring_order
from tracekit.ingest.read_options import ReadOptions
from tracekit.ingest.run_record import MemoryCounts, RunRecord
from tracekit.ingest.selection import select
from tracekit.ingest.spill import Spill
from tracekit.ingest.topology import node_of_ranks
from tracekit.summary import encode

GPU = ROOT / "tests" / "data" / "gpu"


def _copy(sample: str, tmp_path: Path) -> Path:
    run = tmp_path / sample
    shutil.copytree(SAMPLES / sample, run, ignore=shutil.ignore_patterns("analysis"))
    return run


def test_job_holds_what_the_folder_says() -> None:
    run = SAMPLES / "hsdp"
    raw = json.loads(runfolder.run_json_path(run).read_text())
    job = load(run)
    assert job.run is not None and job.run.raw == raw
    assert (job.run.strategy, job.run.world_size, job.run.precision) == (
        raw["strategy"],
        raw["world_size"],
        raw["precision"],
    )
    opts = raw["config"]["strategy_options"]
    assert job.run.config.shard_degree == opts["shard_size"]
    assert job.run.config.params == raw["config"]["params"]
    assert job.run.nodes == {t["rank"]: t["node"] for t in raw["topology"]}
    assert job.ranks == list(range(raw["world_size"]))
    assert sorted(job.events["rank"].unique().to_list()) == job.ranks
    for rank in job.ranks:
        counted = json.loads(runfolder.memory_path(run, rank).read_text())
        assert job.memory[rank].model_states_bytes == counted["model_states_bytes"]
        assert job.memory[rank].optimizer_bytes == counted["optimizer_bytes"]
    dumps = sorted((run / "nccl").glob("fr_rank*.json"))
    assert [r.path for r in job.flight_records] == dumps
    assert (
        [r.rank for r in job.flight_records]
        == [read_flight_record(p).rank for p in dumps]
        == list(range(len(dumps)))
    )
    assert job.topology.source == "run.json" and job.topology.nodes == job.run.nodes
    assert job.nccl is None  # the CPU samples keep no NCCL logs


def test_nccl_logs_are_parsed_once_with_their_layout_and_ring() -> None:
    run = GPU / "dp-cuda-nccl"
    job = load(run)
    log = read_nccl_logs(run)
    assert job.nccl is not None and job.nccl.log.files == log.files
    assert job.nccl.layout == rank_layout(log)
    assert job.nccl.ring == ring_order(log)
    assert job.nccl.ring_of(2) == ring_order(log, 2)


def test_a_rank_is_read_on_its_own_and_the_job_assembles_the_same(tmp_path: Path) -> None:
    run = _copy("dp", tmp_path)
    (run / "nccl" / "dump.json").write_text("not json")  # no rank in its name: the job's
    source = locate(run)
    one = load_rank(source, 1)
    counted = json.loads(runfolder.memory_path(run, 1).read_text())
    assert one.memory == MemoryCounts.from_json(counted)
    assert [d.path.name for d in one.dumps] == ["fr_rank1.json"]
    assert one.dumps[0].record is not None and one.dumps[0].record.rank == 1

    whole = load(run)
    selection = select(list(source.traces))
    scans = read_selected(source, selection, ReadOptions(), Spill())
    pieces = [load_rank(source, r) for r in (1, 0)]  # any order
    job = assemble_job(source, selection, scans, pieces)
    assert job.memory == whole.memory
    assert [r.path for r in job.flight_records] == [r.path for r in whole.flight_records]
    assert [r.rank for r in job.flight_records] == [0, 1]
    assert job.warnings == whole.warnings
    assert any(w.startswith("flight recorder: ") and "dump.json" in w for w in job.warnings)


def test_analyses_read_no_file(tmp_path: Path) -> None:
    """A Job loaded from a folder that is then removed analyses to the same summary."""
    run = _copy("pp-gpipe", tmp_path)
    expected = analyze(run).summary
    job = load(run)
    shutil.rmtree(run)
    inp = prepare(job)
    got = assemble(inp, run_sections(inp)).summary
    assert encode(got) == encode(expected)
    assert got.pipeline.per_stage[0].activation_peak_bytes is not None


def test_memory_counts_keep_integers_only() -> None:
    counts = MemoryCounts.from_json(
        {"params_bytes": 8, "grads_bytes": "8", "optimizer_bytes": True, "other": 1}
    )
    assert counts == MemoryCounts(params_bytes=8)


def test_run_record_reads_odd_config_values_as_unknown() -> None:
    run = RunRecord.from_json(
        {
            "strategy": "pp-gpipe",
            "status": "failed",
            "errors": [{"rank": 1, "kind": "exception", "message": "boom\n  here"}, "odd"],
            "config": {
                "params": "many",
                "microbatches": "4",
                "strategy_options": {"stages": None, "process_groups": [{"name": "0"}, 3]},
            },
        }
    )
    assert run.config.params == 0 and run.config.microbatches == 4 and run.config.stages is None
    assert run.config.process_groups == ()  # none with a ranks list
    assert run.status_line() == "the run's status is 'failed': rank 1 exception: boom here"
    assert run.echo()["world_size"] is None and run.echo()["strategy"] == "pp-gpipe"


@pytest.mark.parametrize(
    "given, source, nodes",
    [
        ({"ranks_per_node": 2}, "ranks_per_node", {0: 0, 1: 0, 2: 1}),
        ({"run_nodes": {0: 1, 1: 1, 2: 0}}, "run.json", {0: 1, 1: 1, 2: 0}),
        ({"run_nodes": {0: 1}, "layout": {r: {"node": r} for r in range(3)}}, "nccl_log", None),
        ({"hosts": {0: "b", 1: "a", 2: "b"}}, "host_name", {0: 0, 1: 1, 2: 0}),
        ({}, "unknown", {0: 0, 1: 0, 2: 0}),
    ],
)
def test_topology_takes_the_first_source_that_covers_every_rank(given, source, nodes) -> None:
    topo = node_of_ranks([2, 0, 1], **given)
    assert topo.source == source
    assert topo.nodes == (nodes or {0: 0, 1: 1, 2: 2})
    assert bool(topo.warnings) == (source == "unknown")


def test_collectives_are_matched_once_and_shifts_handed_on(monkeypatch) -> None:
    """Clocks aligned on a 2-node run: the calls are matched once and moved with the events
    (not matched again), and the Analysis gets the shifts prepare applied."""
    from tracekit.analyses import collectives

    calls = []
    match = collectives.raw_collectives
    monkeypatch.setattr(collectives, "raw_collectives", lambda *a: calls.append(1) or match(*a))
    a = analyze(SAMPLES / "hsdp", align_clocks=True, cache=False)
    assert a.summary.clock is not None and a.summary.clock.applied
    assert len(calls) == 1
    assert a.shifts == {int(r): v for r, v in a.summary.clock.offsets_ns.items() if v}


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_is_told_once_per_trace_up_to_every_byte(workers: int) -> None:
    """analyze(progress=...): one call per trace file, counting up to all of them and to the
    sum of their sizes on disk (what the CLI's progress line shows), with threads or processes."""
    run = SAMPLES / "hsdp"
    traces = sorted((run / "traces").glob("*.json*"))
    told: list[tuple[int, int, int, int]] = []
    analyze(run, workers=workers, cache=False, progress=lambda *a: told.append(a)).close()
    total = sum(p.stat().st_size for p in traces)
    assert [t[0] for t in told] == list(range(1, len(traces) + 1)), told
    assert {t[1] for t in told} == {len(traces)} and {t[3] for t in told} == {total}
    assert [t[2] for t in told] == sorted(t[2] for t in told) and told[-1][2] == total
