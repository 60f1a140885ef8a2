"""The schema variants of real traces in miniature (a real parse of real JSON, written here):
they hold the rules tests/test_corpus.py checks on the public corpus in place when the corpus is
not at hand. Each is compared with HTA's definitions recomputed (tests/corpus_reference.py).
"""

from __future__ import annotations

import json

import pytest
from builders.traces import write_trace
from conftest import run_cli
from corpus_reference import breakdown

from tracekit.analysis import analyze

CPU_ONLY = "numbers are CPU-side only"


def _steps(pid: int, n: int, length: float = 100.0) -> list[dict]:
    return [
        {"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{k}", "pid": pid, "tid": pid,
         "ts": k * length, "dur": length - 1}
        for k in range(n)
    ]  # fmt: skip


def _old_schema_trace() -> dict:
    """PyTorch 1.9 (Kineto before 2022): capitalised categories, stream tids as text."""
    events = _steps(7, 3)
    for k, (ts, dur) in enumerate([(10, 30), (50, 20), (120, 40), (180, 10), (230, 30)]):
        launch = {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                  "ts": ts - 5, "dur": 3, "args": {"correlation": 100 + k}}  # fmt: skip
        kernel = {"ph": "X", "cat": "Kernel", "name": f"volta_sgemm_{k}", "pid": 0,
                  "tid": "stream 7", "ts": ts, "dur": dur,
                  "args": {"stream": 7, "correlation": 100 + k}}  # fmt: skip
        events += [launch, kernel]
    events.append({"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)",
                   "pid": 0, "tid": "stream 7", "ts": 90, "dur": 5,
                   "args": {"stream": 7, "correlation": 200}})  # fmt: skip
    events.append({"ph": "X", "cat": "Runtime", "name": "cudaMemcpyAsync", "pid": 7, "tid": 7,
                   "ts": 85, "dur": 2, "args": {"correlation": 200}})  # fmt: skip
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Tesla V100"}],
            "traceEvents": events}  # fmt: skip


def test_old_schema_categories_are_device_work(tmp_path):
    """Before: 'Kernel'/'Memcpy' were not device categories: 100 % idle, compute 0."""
    trace = _old_schema_trace()
    f = write_trace(tmp_path / "rank0.json.gz", trace)
    (rank,) = analyze(f, cache=False).summary.ranks
    ref = breakdown(trace)
    assert ref.idle_pct is not None and 0 < ref.idle_pct < 100
    assert 100 * rank.idle_s / rank.span_s == pytest.approx(ref.idle_pct, abs=0.01)
    assert 100 * rank.compute_s / rank.span_s == pytest.approx(ref.compute_pct, abs=0.01)


def _mtia_trace() -> dict:
    """MTIA: device work in mtia_ccp_events on the device's pid, runtime calls in mtia_runtime,
    baseTimeNanoseconds written as text; backend mtia:hccl (no gloo anywhere)."""
    events = _steps(865, 1, 1000)
    device = [("pe_exe", 0, 200), ("dma_request", 150, 100), ("event_wait", 300, 50),
              ("add-dtype_Float", 400, 300), ("dma_request", 800, 100)]  # fmt: skip
    for k, (name, ts, dur) in enumerate(device):
        events.append({"ph": "X", "cat": "mtia_ccp_events", "name": name, "pid": 17,
                       "tid": 3774, "ts": ts, "dur": dur,
                       "args": {"stream": 108, "correlation": k}})  # fmt: skip
        events.append({"ph": "X", "cat": "mtia_runtime", "name": "runFunction", "pid": 865,
                       "tid": 865, "ts": max(ts - 5, 0), "dur": 2,
                       "args": {"correlation": k}})  # fmt: skip
    return {"schemaVersion": "1", "baseTimeNanoseconds": "1767189312000000000",
            "distributedInfo": {"backend": "mtia:hccl", "rank": 0, "world_size": 1},
            "deviceProperties": [{"id": 17, "name": "ARTEMIS"}], "traceEvents": events}  # fmt: skip


def test_mtia_device_events_are_the_device_timeline(tmp_path):
    """Before: MTIA traces were analysed as CPU traces (idle from cpu_op gaps)."""
    trace = _mtia_trace()
    f = write_trace(tmp_path / "mtia_rank_0.json.gz", trace)
    result = analyze(f, cache=False)
    (rank,) = result.summary.ranks
    ref = breakdown(trace)
    assert 100 * rank.idle_s / rank.span_s == pytest.approx(ref.idle_pct, abs=0.01)
    assert 100 * rank.compute_s / rank.span_s == pytest.approx(ref.compute_pct, abs=0.01)
    assert result.infos[0].base_ns == 1767189312000000000
    assert not [w for w in result.summary.warnings if "gloo" in w]


def test_launches_without_kernels_are_named(tmp_path):
    """HTA's cupti_profiler in miniature: CUDA runtime launches, no kernel events. Before: CPU
    rules, no word about it."""
    events = _steps(5, 1, 500)
    events += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 5, "tid": 5, "ts": 10 + 50 * k,
         "dur": 30} for k in range(5)
    ] + [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 5, "tid": 5,
         "ts": 15 + 50 * k, "dur": 5, "args": {"correlation": k}} for k in range(5)
    ] + [
        {"ph": "X", "cat": "cuda_profiler_range", "name": "range", "pid": 0, "tid": 7,
         "ts": 15 + 50 * k, "dur": 5} for k in range(5)
    ]  # fmt: skip
    f = write_trace(tmp_path / "rank0.json.gz", {"schemaVersion": 1, "traceEvents": events})
    warnings = analyze(f, cache=False).summary.warnings
    (line,) = [w for w in warnings if CPU_ONLY in w]
    assert line.startswith("rank0.json.gz: cuda runtime calls that launch device work")
    assert "cudaLaunchKernel x5" in line and "cuda_profiler_range" in line


def test_unknown_categories_are_named(tmp_path):
    trace = _old_schema_trace()
    trace["traceEvents"].append(
        {"ph": "X", "cat": "npu_kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20, "dur": 5}
    )
    f = write_trace(tmp_path / "rank0.json.gz", trace)
    warnings = analyze(f, cache=False).summary.warnings
    assert any("categories this tracekit does not know: npu_kernel x1" in w for w in warnings)


def _et() -> dict:
    return {"schema": "1.0.3-chakra.0.0.4", "pid": 1, "time": "t", "start_ts": 0,
            "nodes": [{"id": k, "name": "aten::add"} for k in range(2000)]}  # fmt: skip


def test_folder_with_execution_trace_skips_it(tmp_path):
    """Before: the whole folder was refused ('not a Kineto trace')."""
    write_trace(tmp_path / "rank0.json.gz", _old_schema_trace())
    write_trace(tmp_path / "model_et.json.gz", _et())
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.1}))
    result = analyze(tmp_path, cache=False)
    assert [r.rank for r in result.summary.ranks] == [0]
    (line,) = [w for w in result.summary.warnings if w.startswith("skipped ")]
    assert line.startswith("skipped 2 JSON files that are not a Kineto trace")
    assert "config.json" in line and "model_et.json.gz" in line


def test_folder_of_only_execution_traces_is_one_line_error(tmp_path):
    write_trace(tmp_path / "model_et.json.gz", _et())
    run = run_cli("analyze", str(tmp_path), "--out", str(tmp_path / "o"))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"tracekit: {tmp_path / 'model_et.json.gz'}: not a Kineto trace "
        "(Object missing required field `traceEvents`)"
    ]
    assert not (tmp_path / "o").exists()
