"""HTA's temporal breakdown recomputed from a trace's JSON, independently of tracekit's code.

Plain Python over the file (gzip + json), HolisticTraceAnalysis's definitions as
tests/data/corpus/README.md states them:

- device events: complete (``ph: "X"``) events whose category, compared case-insensitively, is
  ``kernel``, ``gpu_memcpy``, ``gpu_memset`` or Kineto's older ``Memcpy`` / ``Memset``, or MTIA's
  ``mtia_ccp_events``; also ``cuda_sync`` events on a stream (HTA keeps every event whose
  ``args.stream`` is not -1: a Stream Sync counts, an Event Sync, stream -1, does not);
- communication kernels: names starting with ``nccl`` / ``rccl`` (also after ``void ``), or
  holding ``ncclDevKernel`` / ``ncclKernel``; memory: the memcpy/memset categories and MTIA's
  ``dma*`` commands; MTIA's ``event_wait`` / ``event_record`` are stream synchronisation;
  compute: every other device event;
- span = last device event end - first device event start; idle = span - |union of all device
  events|; compute = |union of compute events|;
- window: with two or more distinct ``ProfilerStep#N`` markers, only device events launched
  (``args.correlation``) by host events that start before the last marker starts.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"}
_MEMORY_CATS = {"gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_COMM = re.compile(r"^(void\s+)?(nccl|rccl)|ncclDevKernel|ncclKernel", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep#\d+$")


def load(path: Path) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    start = None
    for a, b in sorted(intervals):
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None:
        total += end - start
    return total


@dataclass
class Breakdown:
    rank: int | None
    device_events: int
    span_us: float
    idle_pct: float | None
    compute_pct: float | None
    steps: int  # distinct ProfilerStep markers


def _kind(cat: str, name: str) -> str:
    if cat in _MEMORY_CATS:
        return "memory"
    if cat == "cuda_sync":
        return "sync"
    if cat == "mtia_ccp_events":
        if name.startswith("dma"):
            return "memory"
        if name in ("event_wait", "event_record"):
            return "sync"
        return "compute"
    return "communication" if _COMM.search(name) else "compute"


def breakdown(trace: dict) -> Breakdown:
    """Idle and compute in percent of the device span (None without device events)."""
    device, host = [], []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
            continue
        cat = str(e.get("cat", "")).lower()
        if cat == "cuda_sync":  # on the device's pid: never a host event
            if (e.get("args") or {}).get("stream", -1) != -1:
                device.append((cat, e))
            continue
        (device if cat in _DEVICE else host).append((cat, e))
    steps = {e["name"] for _, e in host if _STEP.match(str(e.get("name", "")))}
    if len(steps) >= 2:
        last = max(e["ts"] for _, e in host if e.get("name") in steps)
        launched = {
            (e.get("args") or {}).get("correlation")
            for _, e in host
            if e["ts"] < last and (e.get("args") or {}).get("correlation") is not None
        }
        device = [(c, e) for c, e in device if (e.get("args") or {}).get("correlation") in launched]
    dist = trace.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    if not device:
        return Breakdown(rank, 0, 0.0, None, None, len(steps))
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for _, e in device]
    compute = [
        s for (c, e), s in zip(device, spans) if _kind(c, str(e.get("name", ""))) == "compute"
    ]
    span = max(b for _, b in spans) - min(a for a, _ in spans)
    if span <= 0:
        return Breakdown(rank, len(device), span, None, None, len(steps))
    idle = span - _union(spans)
    return Breakdown(
        rank, len(device), span, 100 * idle / span, 100 * _union(compute) / span, len(steps)
    )
