"""A hostile file in every input slot of a run folder, of every kind: `tracekit analyze` answers
with exit 0 and a warning naming the file, or exit 2 and one line `tracekit: <file>: <problem>`;
never a traceback, never a hang (a timeout), never all memory (RLIMIT_AS), never a raw escape
character on the terminal (issue #24 item 6; the reader: tracekit.guarded_read).

The slots are the files of a run folder (a copy of sample_traces/dp, with an NCCL log and a
rank's logs/ added); the kinds replace one of them with a FIFO, a symlink to /dev/zero, a
folder or a socket, or rewrite its content: 100k-deep nesting, every integer 2^63, every float
1e400 or NaN/Infinity, control and terminal-escape characters in every string. The fast tier
runs a subset that has every slot and every kind once; the slow tier the whole cross-product.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, SAMPLES

TIMEOUT_S = 60
MEMORY_LIMIT = 3 << 30  # RLIMIT_AS: /dev/zero read whole would pass it
DEPTH = 100_000
ESCAPES = "\x1b[2J\x1b]0;owned\x07\r\x08\x9b"

NCCL_LOG = (
    "host0:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
    "host0:100:100 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n"
    "host0:100:200 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
    "host0:100:200 [0] NCCL INFO Channel 00/02 :    0   1\n"
)
STDERR_LOG = "rank 0 started\nstep 1 loss 5.5 after 0.25 s\n"

#: slot -> (path in the run folder, does analyze read it?)
SLOTS: dict[str, tuple[str, bool]] = {
    "trace": ("traces/rank0.json.gz", True),
    "every-trace": ("traces/*.json.gz", True),
    "run.json": ("run.json", True),
    "memory": ("memory/rank0.json", True),
    "flight-recorder": ("nccl/fr_rank0.json", True),
    "nccl-log": ("nccl/rank0.log", True),
    "train": ("train/rank0.json", False),
    "logs": ("logs/rank0.stderr.log", False),
}
#: kinds that leave no content to read: a reader must refuse them, never block or read forever
UNREADABLE = {"fifo", "dev-zero", "folder", "socket"}


def _content(path: Path) -> Any:
    """The slot's JSON (gunzipped), or its text for the log slots."""
    raw = path.read_bytes()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def _walk(value: Any, leaf: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, leaf) for v in value]
    return leaf(value)


def _rewrite(path: Path, change: Callable[[Any], str]) -> None:
    text = change(_content(path)).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)


def _numbers(big: str, ints: bool) -> Callable[[Any], str]:
    """Every int (or float) of the JSON written as BIG; in text, every number of the lines."""

    def change(value: Any) -> str:
        if isinstance(value, str):
            return "".join(big if c.isdigit() else c for c in value)
        mark = "__tracekit_big__"
        want = int if ints else float
        out = _walk(value, lambda v: mark if type(v) is want else v)
        return json.dumps(out).replace(f'"{mark}"', big)

    return change


def _deep(value: Any) -> str:
    deep = "[" * DEPTH + "]" * DEPTH
    if isinstance(value, str):
        return value + deep + "\n"
    if isinstance(value, dict):
        return json.dumps({**value, "x": 0}).replace('"x": 0', f'"x": {deep}')
    return f"[{deep}]"


#: strings that are names, shown by the analysis: event, host, group, thread names, the strategy
NAMES = {"name", "host_name", "pg_name", "pg_desc", "profiling_name", "thread_name", "strategy"}


def _named(value: Any) -> Any:
    if isinstance(value, dict):
        out = {
            k: v + ESCAPES if k in NAMES and isinstance(v, str) else _named(v)
            for k, v in value.items()
        }
        return {**out, f"note{ESCAPES}": ESCAPES}
    return [_named(v) for v in value] if isinstance(value, list) else value


def _escapes(value: Any) -> str:
    if isinstance(value, str):
        return "".join(line + ESCAPES + "\n" for line in value.splitlines())
    return json.dumps(_named(value))


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


def _socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # the socket file stays after close: nothing listens
    s.close()


def _folder(path: Path) -> None:
    path.mkdir()
    (path / "inside.json").write_text("{}")


KINDS: dict[str, Callable[[Path], None]] = {
    "fifo": lambda p: _replace(p, os.mkfifo),
    "dev-zero": lambda p: _replace(p, lambda q: q.symlink_to("/dev/zero")),
    "folder": lambda p: _replace(p, _folder),
    "socket": lambda p: _replace(p, _socket),
    "deep": lambda p: _rewrite(p, _deep),
    "int-2^63": lambda p: _rewrite(p, _numbers(str(2**63), ints=True)),
    "float-1e400": lambda p: _rewrite(p, _numbers("1e400", ints=False)),
    "nan": lambda p: _rewrite(p, _numbers("NaN", ints=False)),
    "infinity": lambda p: _rewrite(p, _numbers("-Infinity", ints=True)),
    "escapes": lambda p: _rewrite(p, _escapes),
}

#: the fast tier: every slot and every kind at least once
FAST = [
    ("memory", "fifo"),
    ("flight-recorder", "dev-zero"),
    ("memory", "deep"),
    ("trace", "int-2^63"),
    ("run.json", "float-1e400"),
    ("flight-recorder", "nan"),
    ("nccl-log", "fifo"),
    ("run.json", "socket"),
    ("trace", "folder"),
    ("memory", "escapes"),
    ("train", "dev-zero"),
    ("logs", "fifo"),
    ("memory", "infinity"),
    ("every-trace", "escapes"),
]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run_folder(tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(SAMPLES / "dp", run)
    (run / "nccl" / "rank0.log").write_text(NCCL_LOG)
    (run / "logs").mkdir()
    (run / "logs" / "rank0.stderr.log").write_text(STDERR_LOG)
    return run


def check(tmp: Path, slot: str, kind: str) -> None:
    run = _run_folder(tmp)
    rel, read = SLOTS[slot]
    targets = sorted(run.glob(rel)) if "*" in rel else [run / rel]
    for target in targets:
        KINDS[kind](target)
    names = {t.name for t in targets} | {rel.split("/")[0]}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tracekit.cli", "analyze", str(run), "--out", str(tmp / "out")],
            capture_output=True,
            timeout=TIMEOUT_S,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT), TRACEKIT_CACHE_DIR=str(tmp / "cache")),
            preexec_fn=_limits,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{slot} x {kind}: analyze still running after {TIMEOUT_S} s (a hang)")
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    said = f"{slot} x {kind}: exit {proc.returncode}\n{err[-3000:]}"
    assert "Traceback" not in err, said
    assert "\x1b" not in out + err and "\x9b" not in out + err, f"raw escape reached output: {said}"
    assert proc.returncode in (0, 2), said
    lines = err.splitlines()
    if proc.returncode == 2:
        assert len(lines) == 1 and lines[0].startswith("tracekit: "), said
        assert any(name in lines[0] for name in names), said
        assert not (tmp / "out").exists(), f"half-written output: {said}"
        return
    assert all(line.startswith(("warning: ", "wrote ")) for line in lines), said
    if read and kind in UNREADABLE:
        assert any(line.startswith("warning: ") and targets[0].name in line for line in lines), (
            f"the file was skipped without a word: {said}"
        )


@pytest.mark.parametrize(("slot", "kind"), FAST, ids=[f"{s}-{k}" for s, k in FAST])
def test_hostile_slot(tmp_path: Path, slot: str, kind: str) -> None:
    check(tmp_path, slot, kind)


ALL = [(s, k) for s in SLOTS for k in KINDS if (s, k) not in FAST]


@pytest.mark.slow(reason="the whole slot x kind cross-product (the rest of 80 analyses)")
@pytest.mark.parametrize(("slot", "kind"), ALL, ids=[f"{s}-{k}" for s, k in ALL])
def test_hostile_slot_everywhere(tmp_path: Path, slot: str, kind: str) -> None:
    check(tmp_path, slot, kind)


GROUP_NUMBERS = [
    ("pg_size", 2**31),
    ("pg_size", 2**40),
    ("pg_size", 2**63),
    ("ranks", [0, 5]),
    ("ranks", [0, "x"]),
]


@pytest.mark.parametrize(
    ("key", "value"), GROUP_NUMBERS, ids=[f"{k}={v}" for k, v in GROUP_NUMBERS]
)
def test_process_group_numbers(tmp_path: Path, key: str, value: Any) -> None:
    """distributedInfo.pg_config's numbers are range-checked before they size or type anything:
    a pg_size no world has, ranks outside the world of 2 or not ints, in every rank's trace, are
    a warning naming the figure and the analysis goes on (issue #24: polars tracebacks)."""
    run = _run_folder(tmp_path)
    for trace in sorted((run / "traces").glob("*.json.gz")):
        data = json.loads(gzip.decompress(trace.read_bytes()))
        data["distributedInfo"]["pg_config"][0][key] = value
        trace.write_bytes(gzip.compress(json.dumps(data).encode()))
    proc = subprocess.run(
        [sys.executable, "-m", "tracekit.cli", "analyze", str(run), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        preexec_fn=_limits,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    figure = str(value)[:40]
    warned = [w for w in proc.stderr.splitlines() if w.startswith("warning: ") and key in w]
    assert any(figure in w and "world of 2" in w for w in warned), proc.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert any(key in w and figure in w for w in summary["warnings"])
