"""A rank read in parts (tracekit.ingest.kineto_stream, issue #29): the same analysis, in bounded
memory.

The traces are real (tests/data/gpu's CUDA/gloo rank, and that rank's events repeated in time
by benchmarks/inputs.py's method into a 45 MB trace); the held analysis is the judge.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import TracekitError
from tracekit.ingest import _kscan, kineto_stream
from tracekit.ingest.rank_memory import MEMORY_ENV, block_bytes, json_size, rank_memory

ROOT = Path(__file__).resolve().parent.parent
RANK = ROOT / "tests" / "data" / "gpu" / "dp-cuda-gloo" / "traces" / "rank0.json.gz"  # 6.3 MB


def _summary(path: Path, setting: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, object]:
    monkeypatch.setenv(MEMORY_ENV, setting)
    a = tracekit.analyze(path, cache=False)
    return json.dumps(a.summary_dict(), sort_keys=True), a.events_at[0]


def test_split_finds_whole_events() -> None:
    # brackets and quotes inside strings do not count; the array's own "]" closes it
    data = b'{"a": "}\\"]"}, {"b": [1, {"c": 2}]}, {"d'
    end, closed = _kscan.split(data, 0)
    assert (data[:end], closed) == (b'{"a": "}\\"]"}, {"b": [1, {"c": 2}]}', False)
    assert _kscan.split(b', {"x": 1}\n ] , "tail"', 0) == (12, True)  # at the "]"
    assert _kscan.split(b'{"open": [', 0) == (0, False)
    even = b'{"a": "x\\\\"}, {"b": "]\\\\\\"}"}'  # x\\ closes; \\\" does not
    assert _kscan.split(even, 0) == (len(even), False)


def test_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "4M")
    assert rank_memory() == 4 * 2**20 and block_bytes(rank_memory()) == 2**20
    assert block_bytes(2**40) == 64 * 2**20
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(TracekitError, match="TRACEKIT_RANK_MEMORY='lots' is not a number"):
        rank_memory()


def test_bad_setting_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, MEMORY_ENV: "lots", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "tracekit", "analyze", str(RANK), "--no-cache"],
        env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "tracekit: TRACEKIT_RANK_MEMORY='lots' is not a number of bytes (e.g. 256M)"
    ]


def test_parts_give_the_held_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 6.3 MB rank over a 1-byte setting: read in 1 MiB slices, the same summary."""
    held, held_at = _summary(RANK, "1T", monkeypatch)
    streamed, streamed_at = _summary(RANK, "1", monkeypatch)
    assert held_at.parts == () and len(streamed_at.parts) >= 5  # type: ignore[attr-defined]
    assert streamed == held


def test_declined_slice_takes_the_held_read(tmp_path: Path) -> None:
    """A slice the scanner declines (NaN durations, which only the msgspec path reads) gives
    None, and the analysis the held read's result."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
        for i in range(20000)
    ]
    text = json.dumps({"traceEvents": events}).replace('"dur": 1}', '"dur": NaN}', 1)
    path = tmp_path / "rank0.json"
    path.write_text(text)
    assert kineto_stream.read_streamed(path, tmp_path, 1) is None
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.json"]  # nothing of ours left


@pytest.fixture(scope="module")
def big_rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 6.3 MB rank's events 8 times in time (benchmarks/inputs.py): 45 MB of JSON."""
    sys.path.insert(0, str(ROOT / "benchmarks"))  # inputs.py imports its siblings
    spec = importlib.util.spec_from_file_location("inputs", ROOT / "benchmarks" / "inputs.py")
    assert spec is not None and spec.loader is not None
    inputs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inputs)
    source = json.loads(gzip.decompress(RANK.read_bytes()))
    head = {k: v for k, v in source.items() if k != "traceEvents"}
    path = tmp_path_factory.mktemp("big") / "rank0.json.gz"
    inputs.write_trace(head, path, inputs._copies(source, 8))
    return path


@pytest.mark.slow
def test_big_rank_over_the_setting(big_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """45 MB of JSON under a 4 MiB setting: 1 MiB slices, the held analysis byte for byte."""
    held, _ = _summary(big_rank, "1T", monkeypatch)
    streamed, at = _summary(big_rank, "4M", monkeypatch)
    assert len(at.parts) >= 30  # type: ignore[attr-defined]
    assert streamed == held


#: the per-rank read task (rank_scan.scan_file) under RLIMIT_AS: the address space it has when
#: warmed up (polars' threads and the scanner started on the small rank), plus ALLOW bytes
CHILD = textwrap.dedent(
    """
    import resource, sys, tempfile
    from pathlib import Path
    from tracekit.ingest import rank_scan

    def vm():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    small, big, allow = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with tempfile.TemporaryDirectory() as tmp:
        rank_scan.scan_file(small, tmp)
        limit = vm() + allow
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        scan = rank_scan.scan_file(big, tmp)
        print("read", scan.slim.height, "slim rows in", len(scan.events.parts), "parts")
    """
)


def _read_under_limit(big: Path, setting: str, allow: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        MEMORY_ENV: setting,
        "PYTHONPATH": str(ROOT),
        "MALLOC_ARENA_MAX": "2",  # glibc's per-thread arenas reserve 64 MB of address space each
        "POLARS_MAX_THREADS": "2",
    }
    cmd = [sys.executable, "-c", CHILD, str(RANK), str(big), str(allow)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_bound_holds_under_ulimit(big_rank: Path) -> None:
    """40 MiB of address space beyond a warm worker's: the streamed read of the 45 MB rank fits
    (measured: it grows ~16 MiB), the held read does not (~90 MiB: JSON, columns, events)."""
    allow = 40 * 2**20
    streamed = _read_under_limit(big_rank, "4M", allow)
    assert streamed.returncode == 0, streamed.stderr[-2000:]
    assert "slim rows in" in streamed.stdout
    held = _read_under_limit(big_rank, "1T", allow)
    assert held.returncode != 0, held.stdout
    assert "memory allocation" in held.stderr or "MemoryError" in held.stderr, held.stderr[-2000:]


def test_streamed_rank_writes_its_cache_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache=True: the entry is written from the parts, and a warm analysis reads it back."""
    held, _ = _summary(RANK, "1T", monkeypatch)
    monkeypatch.setenv(MEMORY_ENV, "1")
    cold = tracekit.analyze(RANK, cache=True, cache_dir=tmp_path)
    assert cold.events_at[0].parts
    entries = list(tmp_path.glob("*.events.parquet"))
    assert len(entries) == 1
    warm = tracekit.analyze(RANK, cache=True, cache_dir=tmp_path)
    assert warm.events_at[0].parts == ()  # read from the entry, not streamed again
    for a in (cold, warm):
        assert json.dumps(a.summary_dict(), sort_keys=True) == held


def _error(fn: Callable[[], object]) -> str:
    with pytest.raises(TracekitError) as err:
        fn()
    return str(err.value)


def test_parts_refuse_and_word_as_the_held_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by running tests/test_bad_input.py with every rank read in parts: a trace without
    X events, and a gzip bomb refused from its trailer before it is read, say what the held
    read says; a FIFO is not opened (it would block)."""
    source = json.loads(gzip.decompress(RANK.read_bytes()))
    source["traceEvents"] = [e for e in source["traceEvents"] if e.get("ph") == "M"]
    meta = tmp_path / "rank0.json"
    meta.write_text(json.dumps(source))
    bomb = tmp_path / "bomb" / "rank0.json.gz"
    bomb.parent.mkdir()
    bomb.write_bytes(gzip.compress(b"\0" * (64 * 2**20)))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert json_size(fifo) == 0
    monkeypatch.setenv("TRACEKIT_MAX_TRACE_BYTES", "1M")
    said = {}
    for setting in ("1T", "1"):
        monkeypatch.setenv(MEMORY_ENV, setting)
        said[setting] = [
            _error(lambda: tracekit.analyze(meta, cache=False)),
            _error(lambda: tracekit.analyze(bomb, cache=False)),
        ]
    assert said["1"] == said["1T"]
    assert "no timed events" in said["1"][0] and "0.07 GB of JSON once" in said["1"][1]
