"""Reading traces ahead while `tracekit analyze` imports (tracekit.ingest.read_ahead),
and gunzip by libdeflate: the same bytes and the same events as a plain read, or a plain read."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from builders.traces import NCCL_DATA
from conftest import ROOT

from tracekit import analyze
from tracekit.ingest import kineto_files, read_ahead, read_trace
from tracekit.summary import encode


@pytest.fixture
def ranks(tmp_path: Path) -> list[Path]:
    files = [tmp_path / f"rank{r}.json.gz" for r in range(3)]
    for f in files:
        shutil.copyfile(NCCL_DATA, f)
    yield files
    read_ahead.discard()


@pytest.mark.corpus
def test_read_ahead_gives_a_plain_reads_events(ranks: list[Path]) -> None:
    """Each file read ahead is handed out once, with its scan, and parses to the same events."""
    plain = [read_trace(f, rank=r) for r, f in enumerate(ranks)]
    kineto_files.prefetch(ranks).join(timeout=60)
    data = kineto_files.read_bytes(ranks[0])
    assert read_ahead.take_scan(data) is not None, "the read-ahead's scan"
    assert read_ahead.take_scan(data) is None, "handed out once"
    assert data == gzip.decompress(NCCL_DATA.read_bytes())
    kineto_files.prefetch(ranks).join(timeout=60)
    for r, f in enumerate(ranks):
        info, frame = read_trace(f, rank=r)
        assert frame.equals(plain[r][1]) and info == plain[r][0]
    assert read_ahead.take_scan(data) is None


@pytest.mark.corpus
def test_a_file_changed_after_reading_ahead_is_read_again(ranks: list[Path]) -> None:
    kineto_files.prefetch(ranks[:1]).join(timeout=60)
    ranks[0].write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert kineto_files.read_bytes(ranks[0]) == b'{"traceEvents": []}'


@pytest.mark.corpus
def test_stopped_read_ahead_leaves_the_rest_to_the_parse(ranks: list[Path]) -> None:
    """A file the read-ahead has not started is read by whoever asks; none is read twice."""
    kineto_files.prefetch(ranks, budget=1).join(timeout=60)  # one file, then over budget
    for f in ranks:
        assert kineto_files.read_bytes(f) == gzip.decompress(NCCL_DATA.read_bytes())


#: `tracekit analyze` as the console script runs it, with the read-ahead's hand-outs counted:
#: a file whose bytes the parse took from the read-ahead (kineto_files.read_bytes)
OBSERVED_CLI = """
import sys
from tracekit.ingest import read_ahead

taken, take = [], read_ahead.take

def counted(path):
    data = take(path)
    if data is not None:
        taken.append(path)
    return data

read_ahead.take = counted
from tracekit.cli import main
try:
    main(sys.argv[1:])
finally:
    print(f"read ahead: {len(taken)}", file=sys.stderr)
"""


@pytest.mark.corpus
def test_cli_reads_ahead_and_writes_the_summary_analyze_gives(tmp_path: Path) -> None:
    """The CLI reads the traces ahead while it imports (the parse takes their bytes from the
    read-ahead) and writes the summary analyze() gives without one."""
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copyfile(NCCL_DATA, folder / "rank0.json.gz")
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-c", OBSERVED_CLI, "analyze", str(folder), "--out", str(out)]
        + ["--no-cache"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 0, r.stderr
    (taken,) = [int(line.split(": ")[1]) for line in r.stderr.splitlines() if "read ahead" in line]
    assert taken >= 1, r.stderr
    want = encode(analyze(folder, cache=False).summary)
    assert (out / "summary.json").read_text() == want


@pytest.mark.corpus
@pytest.mark.skipif(kineto_files._libdeflate() is None, reason="no libdeflate on this machine")
def test_libdeflate_reads_one_member_of_the_stated_size_else_declines() -> None:
    """One call for the usual trace; zlib's path (None here) for anything else."""
    raw = NCCL_DATA.read_bytes()
    text = zlib.decompress(raw, 31)
    assert kineto_files._gunzip_whole(raw, len(text)) == text
    assert kineto_files._gunzip_whole(raw + bytes(64), len(text)) == text  # zero padding
    assert kineto_files._gunzip_whole(raw + raw, len(text)) is None  # a second member
    assert kineto_files._gunzip_whole(raw, len(text) + 1) is None  # another size
    assert kineto_files._gunzip_whole(raw, len(text) - 1) is None  # never past the buffer
    assert kineto_files._gunzip_whole(raw[:-9], len(text)) is None  # truncated
    damaged = bytearray(raw)
    damaged[len(raw) // 2] ^= 0xFF
    assert kineto_files._gunzip_whole(bytes(damaged), len(text)) is None
