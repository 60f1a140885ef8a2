"""Where one rank's analysis spends its time and memory, stage by stage (issue #29).

    python benchmarks/stages.py TRACE [--stream]

Stages, each timed (wall, CPU of this process) with the RSS after it and the peak so far:
gunzip (kineto_files.read_bytes), scan (the C scanner alone, on the same bytes), columns
(kineto_decode: scan + the X events' raw columns), events (kineto_classify: the events table
and TraceInfo), then the rest of ``tracekit.analyze`` on that trace: the read (load, again: its
read is one of the stages above), the timeline step (prepare) and the sections. ``--stream``:
the streamed read (tracekit.ingest.kineto_stream) in place of the first four.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _stage(name: str, fn: Callable[[], Any]) -> Any:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{name:<10} {wall:7.2f} s wall {cpu:7.2f} s CPU  rss {_rss() / 1e6:7.0f} MB  "
          f"peak so far {peak / 1e6:7.0f} MB", flush=True)  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--stream", action="store_true")
    a = p.parse_args()
    import tempfile

    from tracekit import stopping
    from tracekit.analyses.prepare import prepare
    from tracekit.analysis import _map_on, run_sections
    from tracekit.ingest import _kscan, kineto_stream
    from tracekit.ingest.kineto import _read_decoded
    from tracekit.ingest.kineto_decode import decode_trace
    from tracekit.ingest.kineto_files import pin_mmap_threshold, read_bytes
    from tracekit.ingest.load import load
    from tracekit.ingest.read_options import ReadOptions

    pin_mmap_threshold()
    print(f"{a.trace}: {a.trace.stat().st_size / 1e6:.0f} MB on disk", flush=True)
    if a.stream:
        with tempfile.TemporaryDirectory() as tmp:
            _stage("streamed", lambda: kineto_stream.read_streamed(a.trace, tmp, 0))
    else:
        data = _stage("gunzip", lambda: read_bytes(a.trace))
        print(f"{'':<10} {len(data) / 1e6:.0f} MB of JSON", flush=True)
        _stage("scan", lambda: _kscan.scan(data, stopping.flag()))
        gc.collect()
        decoded = _stage("columns", lambda: decode_trace(data, a.trace))
        _stage("events", lambda: _read_decoded(decoded, a.trace, None))
        del data, decoded
        gc.collect()
    options = ReadOptions.of(cache=False)
    job = _stage("read", lambda: load(a.trace, options))
    inp = _stage("timeline", lambda: prepare(job, None, _map_on(None, None)))
    _stage("sections", lambda: run_sections(inp))


if __name__ == "__main__":
    main()
