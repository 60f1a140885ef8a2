"""Kineto trace files for the tests: hand-built ones and variants of the real ones.

Hand-built traces hold events whose times are given in integer nanoseconds and written in
Kineto's units (``ts`` / ``dur`` in microseconds, as floats): what the events cover is known by
construction, so every number an analysis gives can be checked against arithmetic done by hand.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from .corpus_root import HTA as _CORPUS_HTA

XSS = "<img src=x onerror=alert(1)>"
#: HolisticTraceAnalysis's traces in the public corpus (tests/builders/corpus_root.py; MIT: see
#: docs/corpus-sources.md): a test that reads them is marked ``pytest.mark.corpus``
HTA = _CORPUS_HTA
TRACE_FILTER = HTA / "trace_filter"
NCCL_DATA = HTA / "nccl_parser_config" / "nccl_data.json.gz"
CPU_ONLY = HTA / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def complete(
    name: str, cat: str, start_ns: int, end_ns: int, *, pid: int = 1, tid: int = 1, **args: Any
) -> dict:
    """One complete ("X") event from start_ns to end_ns; ``args`` as Kineto writes them."""
    event = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start_ns / 1000,
        "dur": (end_ns - start_ns) / 1000,
    }
    return {**event, "args": args} if args else event


def thread_name(pid: int, tid: int, name: str) -> dict:
    """The metadata event that names a thread."""
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def kineto(events: list[dict], rank: int, world_size: int, backend: str = "gloo") -> dict:
    """A trace as torch.profiler writes it for one rank of a job."""
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": backend, "rank": rank, "world_size": world_size},
        "traceEvents": events,
    }


def write_trace(path: Path, trace: dict) -> Path:
    """Write a trace as gzipped JSON (the folders above are made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return path


def read_gz(path: Path) -> dict:
    """A gzipped JSON trace."""
    return json.loads(gzip.decompress(path.read_bytes()))


def small_trace() -> dict:
    """A small real trace: HTA's cpu_only, one gloo CPU rank."""
    return read_gz(CPU_ONLY)


def xss_trace_folder(dst: Path, src: Path = TRACE_FILTER) -> Path:
    """trace_filter with its longest GPU kernel renamed to an XSS payload."""
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.json.gz")):
        doc = read_gz(f)
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
        target = max(kernels, key=lambda e: e.get("dur", 0))["name"]
        for e in doc["traceEvents"]:
            if e.get("name") == target:
                e["name"] = XSS
        write_trace(dst / f.name, doc)
    return dst
