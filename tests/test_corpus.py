"""Every real trace reads right: tracekit's idle and compute per rank against HTA's definitions
recomputed from the JSON (tests/corpus_reference.py, plain Python, none of tracekit's code).

Corpus roots: tests/data/corpus (committed) and, when set, ``TRACEKIT_CORPUS`` (a folder laid
out the same way; tests/data/corpus/README.md lists every trace of the public corpus, where it
comes from and under which licence). A folder whose traces are ranks of one job (distinct
distributedInfo ranks, one world size) is analysed as one job; every other trace alone.

Within 0.5 points where the reference finds device events. Where it finds none (CPU-only
traces), tracekit's numbers are CPU-side by design: the test asserts that a trace showing a
device (runtime launches, deviceProperties) says so in a warning. Warnings never mention gloo
on a trace that has no gloo in it.

The synthetic traces further down are the schema variants in miniature (a real parse of real
JSON, written here): they hold the rules in place when the public corpus is not at hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from builders.traces import write_trace
from conftest import run_cli
from corpus_reference import breakdown, load

from tracekit.analysis import analyze

HERE = Path(__file__).resolve().parent
ROOTS = [HERE / "data" / "corpus"] + (
    [Path(os.environ["TRACEKIT_CORPUS"])] if os.environ.get("TRACEKIT_CORPUS") else []
)
TOLERANCE = 0.5  # percentage points
CPU_ONLY = "numbers are CPU-side only"


def _kineto(path: Path) -> dict | None:
    try:
        data = load(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "traceEvents" in data else None


def _units() -> list[tuple[str, Path, list[Path]]]:
    """(id, path to analyse, its Kineto trace files)."""
    units, seen = [], set()
    for root in ROOTS:
        if not root.is_dir():
            continue
        folders: dict[Path, list[Path]] = {}
        for f in sorted(root.rglob("*.json*")):
            if "analysis" in f.parts or f.name.endswith(".parquet"):
                continue
            if _kineto(f) is not None:
                folders.setdefault(f.parent, []).append(f)
        for folder, files in folders.items():
            dists = [(_kineto(f) or {}).get("distributedInfo") or {} for f in files]
            ranks = [d.get("rank") for d in dists]
            worlds = {d.get("world_size") for d in dists}
            one_job = (
                len(files) > 1
                and None not in ranks
                and len(set(ranks)) == len(files)
                and len(worlds) == 1
                and (worlds.pop() or 0) > 1
            )
            found = [(folder, files)] if one_job else [(f, [f]) for f in files]
            for path, members in found:
                name = str(path.relative_to(root))
                if name not in seen:  # a trace both committed and in TRACEKIT_CORPUS: once
                    seen.add(name)
                    units.append((name, path, members))
    return units


UNITS = _units()


def _has_gloo(trace: dict) -> bool:
    backend = str((trace.get("distributedInfo") or {}).get("backend") or "")
    return "gloo" in backend or any(
        str(e.get("name", "")).startswith("gloo:") for e in trace["traceEvents"]
    )


def _shows_device(trace: dict) -> bool:
    """Runtime calls that launch device work, or listed devices."""
    launch = ("LaunchKernel", "Memcpy", "Memset", "runFunction")
    runtime = any(
        str(e.get("cat", "")).lower() in ("cuda_runtime", "runtime", "mtia_runtime")
        and any(k in str(e.get("name", "")) for k in launch)
        for e in trace["traceEvents"]
    )
    return runtime or bool(trace.get("deviceProperties"))


@pytest.mark.parametrize("unit", UNITS, ids=[u[0] for u in UNITS])
def test_idle_and_compute_match_hta_definitions(unit):
    _, path, files = unit
    result = analyze(path, cache=False)
    by_rank = {r.rank: r for r in result.summary.ranks}
    warnings = result.summary.warnings
    traces = {f: _kineto(f) for f in files}
    for f, trace in traces.items():
        ref = breakdown(trace)
        rank = ref.rank if ref.rank is not None and len(files) > 1 else None
        got = by_rank[rank] if rank is not None else next(iter(by_rank.values()))
        if ref.idle_pct is None:  # no device events: CPU rules, said so where a device shows
            if _shows_device(trace):
                assert any(w.startswith(f"{f.name}: ") and CPU_ONLY in w for w in warnings), (
                    f"{f.name}: device shown but no device events, and no warning says so"
                )
            continue
        idle = 100 * got.idle_s / got.span_s
        compute = 100 * got.compute_s / got.span_s
        assert abs(idle - ref.idle_pct) <= TOLERANCE, f"{f}: idle {idle:.2f} vs {ref.idle_pct:.2f}"
        assert abs(compute - ref.compute_pct) <= TOLERANCE, (
            f"{f}: compute {compute:.2f} vs {ref.compute_pct:.2f}"
        )
    if not any(_has_gloo(t) for t in traces.values()):
        assert not [w for w in warnings if "gloo" in w], warnings


# --- the schema variants in miniature -------------------------------------------------------


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
