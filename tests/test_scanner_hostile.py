"""The C scanner against a trace built to hurt it: names built to collide, and a long scan that
Ctrl-C must stop (issue #24, hostile input slot "names built to collide").

Until issue #24 the scanner's intern table used unseeded FNV-1a: tests/builders/collide.py
builds names that all share one hash, and 16,384 of them took about 90 times as long as as
many random names of the same length (42 MB: 2 min 42 s). The bounds here are ratios measured
in the same test (colliding / random names, an interrupted scan / a whole one), never a wall
time: the machine running the tests may be loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from builders.collide import colliding_names, fnv1a, random_names, trace_bytes

import tracekit
from tracekit.ingest import kineto, kineto_decode

_kscan = pytest.importorskip("tracekit.ingest._kscan", reason="the C scanner is not built")

#: 2^14 names: on the former table about 3.5 s against 40 ms for random names (a ratio near 90)
BITS = 14


def best_scan_time(data: bytes, rounds: int) -> float:
    """The fastest of ROUNDS scans of DATA (the scanner must read it, not decline it)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = _kscan.scan(data)
        times.append(time.perf_counter() - t0)
        assert result is not None, "the scanner declined the trace"
    return min(times)


@pytest.fixture(scope="module")
def names() -> tuple[list[str], list[str]]:
    """(names that all share one FNV-1a hash, random names as many and as long)."""
    colliding = colliding_names(BITS)
    assert len({fnv1a(n.encode()) for n in colliding}) == 1  # the builder did its job
    return colliding, random_names(len(colliding), len(colliding[0]))


def test_names_built_to_collide_scan_as_fast_as_random_ones(names):
    colliding, plain = (trace_bytes(n) for n in names)
    assert len(colliding) == len(plain)
    t_plain = best_scan_time(plain, 5)
    t_colliding = best_scan_time(colliding, 3)
    ratio = t_colliding / t_plain
    print(
        f"{len(names[0])} names: random {t_plain * 1e3:.1f} ms, colliding {t_colliding * 1e3:.1f} ms"
    )
    assert ratio < 4, f"names built to collide took {ratio:.1f}x as long as random names"


def test_a_colliding_trace_reads_exactly_as_the_msgspec_path_reads_it(names, tmp_path: Path):
    colliding, _ = names
    data = trace_bytes(colliding)
    path = tmp_path / "rank0.json"
    path.write_bytes(data)
    fast = kineto_decode._decoded_fast(data, path)
    assert fast is not None, "the fast path must keep such a trace, not decline it"
    info, frame = kineto._read_decoded(fast, path, None)
    slow_info, slow_frame = kineto._read_decoded(
        kineto_decode._decoded_msgspec(data, path), path, None
    )
    assert info == slow_info and frame.equals(slow_frame)
    assert frame["name"].n_unique() == len(colliding)


# --- interruptible: Ctrl-C stops a long scan ---------------------------------------------------

#: a long scan with little memory: events the scanner validates and drops (flows), ~80 MB
_CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    from tracekit.ingest import _kscan, kineto_decode

    event = b'{"ph":"f","cat":"ac2g","name":"flow","pid":1,"tid":1,"ts":1.5,"id":3,"bp":"e"}'
    data = b'{"traceEvents":[' + b",".join([event] * 1_000_000) + b"]}"
    t0 = time.perf_counter()
    assert _kscan.scan(data) is not None
    whole = time.perf_counter() - t0

    def interrupt_at(delay):
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    threading.Thread(target=interrupt_at, args=(whole * 0.2,), daemon=True).start()
    t0 = time.perf_counter()
    try:
        if sys.argv[1] == "main":  # the scan in the main thread: the signal handler runs in it
            _kscan.scan(data)
        else:  # a pool's thread: the main thread waits, and Ctrl-C stops the pool's tasks
            from tracekit import stopping

            with stopping.ThreadPool(1, "test-parse") as pool:
                list(pool.map(kineto_decode._decoded_fast, [data], [Path("x.json")]))
        print("not interrupted", whole)
    except KeyboardInterrupt:
        print("interrupted", whole, time.perf_counter() - t0)
    """
)


@pytest.mark.parametrize("where", ["main", "pool"])
def test_ctrl_c_stops_a_long_scan_promptly(where: str, tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, where],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(Path(tracekit.__file__).resolve().parents[1])),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    words = proc.stdout.split()
    assert words[0] == "interrupted", proc.stdout
    whole, stopped_after = float(words[1]), float(words[2])
    print(
        f"{where}: a whole scan {whole:.3f} s; Ctrl-C at {0.2 * whole:.3f} s, out at {stopped_after:.3f} s"
    )
    # Ctrl-C came at a fifth of the scan: a scan that ignored it would end near the whole
    assert stopped_after < 0.6 * whole, (whole, stopped_after)
