"""Terminal escapes in folder names never reach the terminal raw (issue #24, "More").

Real run folders and a trace folder named with escape sequences (``\\x1b[31m`` colours,
``\\x1b]0;…\\x07`` sets the window title, ``\\x1b[2J`` clears the screen, the one-byte CSI
U+009B, the bidi override U+202E) go through ``compare``, ``analyze``, ``report`` and an error
line, piped and on a real terminal (a pty: rich's colours and its status line). The names must
show in repr's escaped form (``\\x1b``) and none of their sequences may be sent as such.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
RED = "red\x1b[31mrun"
TITLE = "title\x1b]0;pwned\x07run"
TRACES = "trace\x1b[2Jfolder\u009bx\u202eab"
SHOWN = "trace\\x1b[2Jfolder\\x9bx\\u202eab"  # how TRACES must show
#: what must never be written: the names' own sequences (rich's colours use \x1b[...m of their
#: own on a terminal, so a bare \x1b is no evidence there; these are)
RAW = ["\x1b[31mrun", "\x1b]0;", "\x07", "\x1b[2J", "\u009b", "\u202e"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    if not all((SAMPLES / n).is_dir() for n in ("dp", "zero1")):
        pytest.skip("sample_traces/ is not there")
    base = tmp_path_factory.mktemp("escapes")
    shutil.copytree(SAMPLES / "dp", base / RED, ignore=shutil.ignore_patterns("analysis"))
    shutil.copytree(SAMPLES / "zero1", base / TITLE, ignore=shutil.ignore_patterns("analysis"))
    (base / TRACES).mkdir()
    shutil.copy(SAMPLES / "dp" / "traces" / "rank0.json.gz", base / TRACES)
    return base


def on_terminal(*args: str, timeout: float = 300) -> tuple[int, str]:
    """`tracekit ARGS` with stdout and stderr on a pseudo-terminal; its exit status and all it
    wrote there."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="220", TERM="xterm-256color"),
    )
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                proc.kill()
                pytest.fail(f"tracekit {args[0]} did not end in {timeout} s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


def _clean(text: str) -> None:
    for seq in RAW:
        assert seq not in text, f"{seq!r} reached the terminal: {text[-2000:]!r}"


def _piped_clean(text: str) -> None:
    """Piped, tracekit writes no control character at all but newlines."""
    bad = sorted({c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F})
    assert not bad, f"control characters {bad} in {text[-2000:]!r}"
    _clean(text)


def test_compare_shows_escaped_names_piped(folders: Path):
    proc = run_cli("compare", str(folders / RED), str(folders / TITLE), str(folders / TRACES))
    assert proc.returncode == 0, proc.stderr
    _piped_clean(proc.stdout + proc.stderr)
    assert SHOWN in proc.stdout  # the trace folder's display name is its folder's name


def test_compare_on_a_terminal(folders: Path):
    code, text = on_terminal(
        "compare", str(folders / RED), str(folders / TITLE), str(folders / TRACES)
    )
    assert code == 0, text[-2000:]
    _clean(text)
    assert SHOWN in text


def test_analyze_and_report_on_a_terminal(folders: Path, tmp_path: Path):
    out = tmp_path / TITLE
    code, text = on_terminal("analyze", str(folders / RED), "--out", str(out))
    assert code == 0, text[-2000:]
    _clean(text)
    assert "title\\x1b]0;pwned\\x07run" in text  # "wrote <out>" names the folder, escaped
    code, text = on_terminal("report", str(folders / TRACES), "-o", str(tmp_path / "r.md"))
    assert code == 0, text[-2000:]
    _clean(text)


def test_an_error_line_names_the_path_escaped(folders: Path):
    # and a byte that is not UTF-8 (os.fsdecode's surrogate): shown as \xff
    missing = folders / ("gone\x1b]0;pwned\x07" + os.fsdecode(b"\xff") + RED)
    proc = run_cli("analyze", str(missing))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: "), proc.stderr
    assert "gone\\x1b]0;pwned\\x07\\xffred\\x1b[31mrun" in lines[0], lines[0]
    _piped_clean(proc.stderr)


def test_why_and_a_folder_name_that_is_not_utf8(folders: Path, tmp_path: Path):
    """A run folder whose name is not UTF-8 (a byte \\xff) is analysed, cached and diagnosed like
    any other (its cache key hashes the name's own bytes), and shown escaped."""
    odd = tmp_path / (os.fsdecode(b"run\xff") + RED)
    shutil.copytree(folders / RED, odd, ignore=shutil.ignore_patterns("analysis"))
    proc = run_cli("why", str(odd))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("rank "), proc.stdout  # the diagnosis' first line
    _piped_clean(proc.stdout + proc.stderr)
    proc = run_cli("compare", str(odd), str(folders / TITLE))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _piped_clean(proc.stdout + proc.stderr)
