"""summary.json ``memory``: counted model states beside the ZeRO formulas, and the profiler's peak
memory read from the traces' ``[memory]`` events (TraceInfo.memory_peak_bytes)."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import SAMPLES

from instrumented_runs.model import GPTConfig
from tracekit import runfolder, theory
from tracekit.analyses.memory import sharding_degree, theory_for
from tracekit.analysis import analyze
from tracekit.ingest.kineto import read_trace, read_traces
from tracekit.ingest.run_record import RunRecord

PSI = GPTConfig().n_params()
ZERO_SAMPLES = ("zero1", "zero2", "zero3")


def _memory_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]"]


@functools.cache
def _memory_summary(sample: str) -> dict:
    """summary.json ``memory`` of a sample, as written (the JSON the formulas are checked on)."""
    return analyze(SAMPLES / sample).summary_dict()["memory"]


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


# --- ingest: the peak per device -----------------------------------------------------------------


@pytest.mark.parametrize("sample", ["dp", *ZERO_SAMPLES])
def test_peak_is_the_max_total_allocated_of_the_memory_events(sample: str) -> None:
    for path in sorted(runfolder.traces_dir(SAMPLES / sample).glob("rank*.json.gz")):
        events = _memory_events(_load(path))
        assert events, path  # the runs profile memory
        info, _ = read_trace(path)
        assert info.memory_peak_bytes == {"cpu": max(e["args"]["Total Allocated"] for e in events)}


def test_peak_per_device_and_through_worker_processes(tmp_path: Path) -> None:
    base = _load(runfolder.trace_path(SAMPLES / "dp", 0))
    cpu_peak = max(e["args"]["Total Allocated"] for e in _memory_events(base))
    extra = [  # the same instant events a CUDA run records for device 0 and 1
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 1.0,
            "args": {
                "Total Reserved": 0,
                "Total Allocated": total,
                "Bytes": 0,
                "Device Id": dev,
                "Device Type": 1,
            },
        }
        for dev, total in ((0, 5), (0, 7 * 2**30), (1, 3 * 2**30), (0, 2**30))
    ]
    extra.append(
        {"ph": "i", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "ts": 1.0}
    )  # no args
    base["traceEvents"] += extra
    files = []
    for rank in (0, 1):
        base["distributedInfo"]["rank"] = rank
        files.append(tmp_path / f"rank{rank}.json")
        files[-1].write_text(json.dumps(base))
    infos, events = read_traces(files, workers=2)  # TraceInfo crosses a process boundary
    for info in infos:
        assert info.memory_peak_bytes == {"cpu": cpu_peak, "cuda:0": 7 * 2**30, "cuda:1": 3 * 2**30}
    assert "Total Allocated" not in events.columns  # the events schema is unchanged
    # a GPU rank's peak_bytes is its accelerator's
    shutil.copytree(SAMPLES / "dp", tmp_path / "run")
    for rank, path in enumerate(files):
        dst = runfolder.trace_path(tmp_path / "run", rank)
        dst.unlink()
        dst.with_suffix("").write_text(path.read_text())  # rank<R>.json
    rows = analyze(tmp_path / "run").summary.memory.per_rank
    assert [(r.peak_bytes, r.peak_device) for r in rows] == [(7 * 2**30, "cuda:0")] * 2


def test_trace_without_memory_events(tmp_path: Path) -> None:
    trace = _load(runfolder.trace_path(SAMPLES / "dp", 0))
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != "[memory]"]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(trace))
    info, _ = read_trace(path)
    assert info.memory_peak_bytes == {}
    assert analyze(path).summary.memory is None  # a lone trace: nothing counted, no peak


# --- the section --------------------------------------------------------------------------------


def test_dp_sample_is_16_psi() -> None:
    mem = _memory_summary("dp")
    assert mem["theory"] == {
        "model_states_bytes": 16 * PSI,
        "formula": "16Psi",
        "psi": PSI,
        "n": 2,
        "precision": "fp32",
    }
    for r in mem["per_rank"]:
        assert r["params_bytes"] == 4 * PSI and r["grads_bytes"] == 4 * PSI
        assert r["ratio_to_theory"] == pytest.approx(1.0, rel=1e-3)
        assert r["peak_bytes"] > 0 and r["peak_device"] == "cpu"
    assert mem["ratio_to_theory"] == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("sample", ZERO_SAMPLES)
def test_zero_samples_match_their_formula(sample: str) -> None:
    run = SAMPLES / sample
    meta = runfolder.load_run_json(run)
    mem = _memory_summary(sample)
    n = meta["world_size"]
    assert mem["theory"] == {
        **theory.model_states_bytes(sample, meta["precision"], PSI, n),
        "psi": PSI,
        "n": n,
        "precision": meta["precision"],
    }
    assert [r["rank"] for r in mem["per_rank"]] == list(range(n))
    for r in mem["per_rank"]:
        counted = json.loads(runfolder.memory_path(run, r["rank"]).read_text())
        for key in (
            "params_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "model_states_bytes",
            "activation_peak_bytes",
        ):
            assert r[key] == counted[key]  # the run's count, passed through
        assert r["ratio_to_theory"] == pytest.approx(1.0, rel=1e-3)
    # what each stage removed: ZeRO-1 the optimizer's redundancy, ZeRO-2 the gradients', ZeRO-3 all
    dp = _memory_summary("dp")["per_rank"][0]
    r = mem["per_rank"][0]
    assert r["optimizer_bytes"] == pytest.approx(dp["optimizer_bytes"] / n, rel=1e-3)
    assert (r["grads_bytes"] < dp["grads_bytes"]) == (sample != "zero1")
    assert (r["params_bytes"] < dp["params_bytes"]) == (sample == "zero3")


def test_strategies_without_a_formula_keep_per_rank(tmp_path: Path) -> None:
    """TP and the pipelines write memory/ too: per_rank without theory (run.json changed by hand)."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "dp", run, ignore=shutil.ignore_patterns("analysis"))
    data = runfolder.load_run_json(run)
    for strategy in ("tp", "pp-gpipe"):
        data["strategy"] = strategy
        runfolder.write_json_atomic(runfolder.run_json_path(run), data)
        mem = analyze(run).summary.memory
        assert mem.theory is None and mem.ratio_to_theory is None
        assert len(mem.per_rank) == 2 and all(
            r.model_states_bytes == pytest.approx(16 * PSI, rel=1e-3) for r in mem.per_rank
        )


def test_sharding_degree_and_hsdp_theory() -> None:
    run = RunRecord.from_json(
        {
            "strategy": "hsdp",
            "world_size": 4,
            "precision": "fp32",
            "config": {"params": PSI, "strategy_options": {"shard_size": 2, "replicate_size": 2}},
        }
    )
    assert sharding_degree(run) == 2
    assert theory_for(run)["model_states_bytes"] == 8 * PSI  # 16 Psi / 2: ZeRO-3 inside a node
    run = RunRecord.from_json(
        {"strategy": "zero2", "world_size": 4, "precision": "bf16-mixed", "config": {"params": PSI}}
    )
    assert theory_for(run)["formula"] == "2Psi+14Psi/N" and theory_for(run)["n"] == 4
    tp = RunRecord.from_json({"strategy": "tp", "world_size": 2, "config": {"params": PSI}})
    assert theory_for(tp) is None
