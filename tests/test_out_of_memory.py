"""Memory running out is one line, exit status 2, no traceback (issue #24, "More").

``tracekit analyze`` of a real 80 MB trace under an address-space limit (RLIMIT_AS, as
``ulimit -v`` sets it) a little above what the interpreter and tracekit's imports take: reading
the trace fails (MemoryError), or the read-ahead has taken the room first and a library's
import fails to map its code (an ImportError). Until issue #24 both were tracebacks. A polars
panic (pyo3_runtime.PanicException, a BaseException) is one tracekit line too.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_dash_hostile import big_trace

REPO = Path(__file__).resolve().parents[1]
IMPORTS = "import tracekit.cli.analysis, tracekit.analysis, polars, msgspec, numpy"


def _peak_after_imports() -> int:
    """Bytes of address space a tracekit process has taken once its imports are done."""
    code = IMPORTS + "; print([l for l in open('/proc/self/status') if l.startswith('VmPeak')][0])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=120,
        check=True,
    ).stdout
    return int(out.split()[1]) * 1024


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    return big_trace(tmp_path_factory.mktemp("oom") / "big")


#: what polars' Rust code writes before it aborts (RUST_BACKTRACE=0): the allocation error
#: handler's line, and jemalloc's (its allocator) when it cannot start a thread
RUST_LINES = ("memory allocation of ", "note: run with `RUST_BACKTRACE=1`", "<jemalloc>: ")


@pytest.mark.parametrize("room_mb", [16, 64, 400])
def test_out_of_memory_is_one_line(big: Path, tmp_path: Path, room_mb: int):
    limit = _peak_after_imports() + (room_mb << 20)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out = tmp_path / "analysis"
    proc = subprocess.run(
        # --ranks 0: no read-ahead racing the imports, so they are done when reading starts
        # (else which of numpy, OpenBLAS or the read fails first varies from run to run)
        [sys.executable, "-m", "tracekit.cli", "analyze", str(big), "--no-cache", "--ranks", "0"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), RUST_BACKTRACE="0"),
        preexec_fn=cap,
        timeout=300,
    )
    print(f"RLIMIT_AS {limit >> 20} MB: rc {proc.returncode}, {proc.stderr.strip()!r}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("tracekit: ")]
    assert len(ours) == 1 and ours[0].startswith(f"tracekit: {big}: out of memory ("), ours
    if "SIGABRT" in ours[0]:
        # polars' own lines come first, from several threads at once (they may interleave)
        assert any(w in proc.stderr for w in RUST_LINES), proc.stderr[-3000:]
    else:
        assert proc.stderr.splitlines() == ours  # caught in Python: that one line, nothing else
    assert not out.exists()  # nothing half-written


_PANIC = textwrap.dedent(
    """
    import sys, click, polars as pl
    from tracekit import cli

    @cli.cli.command("overflow")
    def overflow():
        pl.int_range(0, 2**62, eager=True)  # polars panics: capacity overflow

    cli.main(["overflow"])
    """
)


def test_a_polars_panic_is_one_tracekit_line():
    proc = subprocess.run(
        [sys.executable, "-c", _PANIC],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), RUST_BACKTRACE="0"),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # Rust's panic hook writes its own lines first (outside Python); ours is the last
    last = proc.stderr.splitlines()[-1]
    assert (
        last == "tracekit: out of memory (polars: capacity overflow); analyse fewer ranks at "
        "once (--ranks, --sample) or give the process more memory"
    ), proc.stderr
