"""tracekit.guarded_read on its own, and where its refusals surface: a FIFO never blocks, a
link to /dev/zero is never read, JSON nesting is bounded, numbers are range-checked, and trace
or NCCL-log entries that are not regular files are named in a warning (issue #24 items 3, 4)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from pathlib import Path

import pytest
from conftest import SAMPLES, run_cli

from tracekit import guarded_read as g
from tracekit.errors import TracekitError


def _bounded(fn, *args):  # noqa: ANN001, ANN202 - a call that must return, not block
    box: list = []
    t = threading.Thread(target=lambda: box.append(_outcome(fn, *args)), daemon=True)
    t.start()
    t.join(30)
    assert box, f"{fn.__name__} blocked"
    return box[0]


def _outcome(fn, *args):  # noqa: ANN001, ANN202
    try:
        return fn(*args)
    except TracekitError as exc:
        return exc


def test_fifo_socket_device_folder_refused_without_blocking(tmp_path: Path) -> None:
    fifo, zero, sock, folder = (tmp_path / n for n in ("f.json", "z.json", "s.json", "d.json"))
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    folder.mkdir()
    said = {p.name: str(_bounded(g.load_json, p)) for p in (fifo, zero, sock, folder)}
    assert said["f.json"] == f"{fifo}: is a FIFO, not a regular file: not read"
    assert said["z.json"].startswith(
        f"{zero}: is a symbolic link to a character device (/dev/zero)"
    )
    assert "is a socket" in said["s.json"] and "is a folder" in said["d.json"]


def test_size_limit_and_regular_files(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"a": [1, 2]}')
    assert g.load_json(p) == {"a": [1, 2]}
    link = tmp_path / "link.json"
    link.symlink_to(p)
    assert g.load_json(link) == {"a": [1, 2]}  # a link to a regular file is read
    with pytest.raises(TracekitError, match="file too large to read"):
        g.read_limited(p, limit=5)


def test_nesting_bound_and_numbers(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TracekitError, match=f"nested more than {g.MAX_DEPTH} levels"):
        g.load_json(p)
    # brackets inside strings are not nesting
    assert g.nesting_depth(b'["' + b"[" * 1000 + b'"]') <= g.MAX_DEPTH
    assert g.nesting_depth(b"[" * (g.MAX_DEPTH + 1) + b"]" * (g.MAX_DEPTH + 1)) > g.MAX_DEPTH
    for bad in ("[NaN]", "[Infinity]", "[1e400]"):
        p.write_text(bad)
        with pytest.raises(TracekitError, match="not valid JSON"):
            g.load_json(p)
    assert g.in_range(2**63, 0, 2**62) is None and g.in_range(True, 0, 2) is None
    assert g.in_range(3, 0, 4) == 3
    assert g.rank_list([0, 5], world=2) is None and g.rank_list([0, "x"]) is None
    assert g.rank_list([1, 0], world=2) == [1, 0]


def test_skipped_entries_in_a_trace_folder_are_named(tmp_path: Path) -> None:
    """A foreign folder: two traces, a FIFO and a link to /dev/null named like traces (item 4)."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for t in (SAMPLES / "dp" / "traces").glob("*.json.gz"):
        shutil.copy(t, folder / t.name)
    os.mkfifo(folder / "rank2.json")
    (folder / "rank3.json.gz").symlink_to("/dev/null")
    proc = run_cli("analyze", str(folder), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    warned = [w for w in proc.stderr.splitlines() if "not a regular file: not read" in w]
    assert any("rank2.json: is a FIFO" in w for w in warned), proc.stderr
    assert any(
        "rank3.json.gz: is a symbolic link to a character device (/dev/null)" in w for w in warned
    )


def test_app_index_never_blocks_on_a_fifo_summary(tmp_path: Path) -> None:
    """The app's index reads analysis/summary.json back through the guarded reader."""
    from dashboards.index import _disk_summary

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "dp", run)
    (run / "analysis").mkdir()
    os.mkfifo(run / "analysis" / "summary.json")
    assert _bounded(_disk_summary, run, ()) is None


def test_nccl_log_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    """A gzipped NCCL log that inflates past the trace size limit is a warning, not hours."""
    import gzip

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "dp", run)
    line = b"host0:1:1 [0] NCCL INFO Channel 00/02 :    0   1\n"
    (run / "nccl" / "rank0.log.gz").write_bytes(gzip.compress(line * ((64 << 20) // len(line))))
    proc = run_cli(
        "analyze", str(run), "--out", str(tmp_path / "out"), timeout=120,
        env={"TRACEKIT_MAX_TRACE_BYTES": "16M"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        "warning: NCCL logs not used: " in proc.stderr
        and "rank0.log.gz: NCCL log not read: more than 0.02 GB of text" in proc.stderr
    ), proc.stderr
