"""The bad-input catalogue (README "Bad input"), end to end through the CLI as a user meets it:
one stderr line `tracekit: <file>: <problem>`, exit status 2, no traceback, nothing left behind;
or, where a partial result is more useful, a warning, the result, summary.json `warnings[]`
and exit status 0. (Empty, truncated and corrupt gzip, truncated JSON, JSON that is not a
trace and a run.json that is not JSON are in test_cli.py.) Inputs are our real sample traces,
damaged on purpose."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, one_line_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.analysis import analyze
from tracekit.errors import TracekitError

TRACE = SAMPLES / "dp" / "traces" / "rank0.json.gz"


def sample() -> dict:
    return json.loads(gzip.decompress(TRACE.read_bytes()))


def nothing_left(folder: Path, expected: set[str]) -> None:
    """Only the inputs: no analysis folder, no temporary (dot) files. (Complete events caches
    beside a trace that parsed, tracekit.ingest.cache, are not half-written outputs.)"""
    names = {p.name for p in folder.iterdir() if not p.name.endswith(".events.parquet")}
    assert names == expected


# --- damaged traces: errors ------------------------------------------------------------------


def test_invalid_utf8(tmp_path: Path) -> None:
    text = json.dumps(sample()).encode().replace(b"ProfilerStep#", b"Profiler\xff\xfeStep#", 1)
    (tmp_path / "rank0.json").write_bytes(text)
    one_line_error(
        run_cli("analyze", str(tmp_path)), str(tmp_path / "rank0.json"), "not valid JSON", "UTF-8"
    )
    nothing_left(tmp_path, {"rank0.json"})


def test_only_metadata_nothing_to_analyse(tmp_path: Path) -> None:
    trace = sample()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    (tmp_path / "rank0.json").write_text(json.dumps(trace))
    one_line_error(
        run_cli("analyze", str(tmp_path / "rank0.json")),
        "rank0.json",
        "the traces hold no timed events",
    )
    nothing_left(tmp_path, {"rank0.json"})


# --- damaged traces: a warning and the result -----------------------------------------------


def test_bad_durations_and_huge_integers_warn_and_analyse(tmp_path: Path) -> None:
    trace = sample()
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    xs[0]["dur"] = -5
    xs[1]["dur"] = float("nan")  # json.dumps writes a bare NaN
    del xs[2]["dur"]
    xs[3]["ts"] = 10**30  # beyond 64-bit nanoseconds
    xs[4]["args"]["External id"] = 2**70
    name = "[red]rank0[bold].json"  # rich markup in a name: printed as text, never styled
    (tmp_path / name).write_text(json.dumps(trace))
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    assert (
        f"{name}: dropped 3 events with missing/negative/NaN durations or non-numeric timestamps"
        in summary["warnings"]
    )
    assert (
        f"{name}: dropped 1 events whose times do not fit in 64-bit nanoseconds"
        in summary["warnings"]
    )
    assert f"warning: {name}: dropped 3 events" in proc.stderr.replace("\n", " ")
    assert summary["ranks"][0]["rank"] == 0 and summary["window"]["steps"] == 2
    nothing_left(tmp_path, {name, "analysis"})


# --- too large for this machine: refused before it is read ------------------------------------

# VmHWM: this process's peak resident memory (ru_maxrss would include the forking pytest's)
MEASURED_CLI = """
import re, sys
from tracekit.cli import main
try:
    main(sys.argv[2:])
finally:
    hwm = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
    open(sys.argv[1], "w").write(hwm)
"""


def test_a_2gb_trace_on_a_small_machine(tmp_path: Path) -> None:
    """A sparse 2 GB file (nothing on disk) with a 1 GB limit: refused without reading it."""
    big = tmp_path / "rank0.json"
    with open(big, "wb") as f:
        f.truncate(2 * 10**9)
    rss = tmp_path.parent / f"{tmp_path.name}.rss"
    proc = subprocess.run(
        [sys.executable, "-c", MEASURED_CLI, str(rss), "analyze", str(big)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "TRACEKIT_MAX_TRACE_BYTES": "1G"},
    )
    one_line_error(
        proc,
        str(big),
        "trace too large to parse on this machine: 2.00 GB of JSON",
        "limit of 1.07 GB (TRACEKIT_MAX_TRACE_BYTES)",
    )
    assert int(rss.read_text()) < 300_000  # KiB (about 60 MB here): the 2 GB was never read
    nothing_left(tmp_path, {"rank0.json"})


def test_default_limit_follows_available_memory(tmp_path: Path) -> None:
    from tracekit.ingest.kineto_files import _available_memory

    avail = _available_memory()
    assert avail and avail > 0
    big = tmp_path / "rank0.json"
    with open(big, "wb") as f:
        f.truncate(2 * avail)  # sparse: twice this machine's free memory
    one_line_error(
        run_cli("analyze", str(big), env={"TRACEKIT_MAX_TRACE_BYTES": ""}),
        "too large",
        "of available memory",
        "TRACEKIT_MAX_TRACE_BYTES",
    )


def _zeros_gzip(n: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(2**20)
    return b"".join([*(c.compress(chunk) for _ in range(n // 2**20)), c.flush()])


def test_gzip_bomb(tmp_path: Path) -> None:
    """64 MB of zeros in 64 KB of gzip, 1 MB limit: refused from the gzip trailer's size; with
    the trailer lying, refused while streaming, as soon as the output passes the limit."""
    bomb = _zeros_gzip(64 * 2**20)
    assert len(bomb) < 200_000
    (tmp_path / "rank0.json.gz").write_bytes(bomb)
    env = {"TRACEKIT_MAX_TRACE_BYTES": "1M"}
    one_line_error(
        run_cli("analyze", str(tmp_path / "rank0.json.gz"), env=env),
        "rank0.json.gz",
        "0.07 GB of JSON once uncompressed",
    )
    (tmp_path / "rank0.json.gz").write_bytes(bomb[:-4] + (100).to_bytes(4, "little"))
    one_line_error(
        run_cli("analyze", str(tmp_path / "rank0.json.gz"), env=env),
        "rank0.json.gz",
        "more than",
        "once uncompressed",
    )
    nothing_left(tmp_path, {"rank0.json.gz"})
    one_line_error(
        run_cli("analyze", str(tmp_path), env={"TRACEKIT_MAX_TRACE_BYTES": "lots"}),
        "TRACEKIT_MAX_TRACE_BYTES='lots' is not a number of bytes",
    )


# --- permissions -------------------------------------------------------------------------------


def test_unreadable_file_and_folder(tmp_path: Path) -> None:
    """chmod 000. As root, the CLI runs without the capabilities that bypass permissions."""
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(TRACE, folder / "rank0.json.gz")
    (folder / "rank0.json.gz").chmod(0)
    try:
        one_line_error(
            run_cli("analyze", str(folder), "--out", str(tmp_path / "a"), as_user=True),
            str(folder / "rank0.json.gz"),
            "cannot read the file (Permission denied)",
        )
        (folder / "rank0.json.gz").chmod(0o644)
        sub = folder / "more"
        sub.mkdir()
        sub.chmod(0)
        one_line_error(
            run_cli("analyze", str(folder), "--out", str(tmp_path / "a"), as_user=True),
            str(sub),
            "cannot read the folder (Permission denied)",
        )
        one_line_error(
            run_cli("analyze", str(sub / "rank1.json.gz"), as_user=True),
            str(sub / "rank1.json.gz"),
            "Permission denied",
        )
    finally:
        for p in (folder / "rank0.json.gz", folder / "more"):
            if p.exists():
                p.chmod(0o755)
    assert not (tmp_path / "a").exists()


# --- run folders -------------------------------------------------------------------------------


@pytest.fixture
def run_copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "dp", run, ignore=shutil.ignore_patterns("analysis"))
    return run


def test_run_json_with_wrong_types(run_copy: Path) -> None:
    data = json.loads((run_copy / "run.json").read_text())
    data["world_size"] = "two"
    (run_copy / "run.json").write_text(json.dumps(data))
    one_line_error(
        run_cli("analyze", str(run_copy)),
        str(run_copy / "run.json"),
        "run.json is damaged (world_size 'two' is not a positive integer)",
    )
    data["world_size"], data["topology"] = 2, [{"rank": "0"}]
    (run_copy / "run.json").write_text(json.dumps(data))
    one_line_error(run_cli("analyze", str(run_copy)), "topology entry")
    data["topology"], data["backend"] = [], ["gloo"]
    (run_copy / "run.json").write_text(json.dumps(data))
    one_line_error(run_cli("analyze", str(run_copy)), "run.json is damaged (backend is not text)")
    assert not (run_copy / "analysis").exists()


def test_out_that_is_a_file(run_copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    one_line_error(
        run_cli("analyze", str(run_copy), "--out", str(target)), str(target), "not a folder"
    )
    assert target.read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


RUN_KEYS = [
    "world_size",
    "status",
    "errors",
    "topology",
    "config",
    "strategy",
    "precision",
    "backend",
    "device",
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["rank", "node", "host", "x"]), inner, max_size=3)
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-rank run folder around a small real gloo trace (HTA cpu_only, rank 34)."""
    from conftest import HTA

    run = tmp_path_factory.mktemp("mutated")
    (run / "traces").mkdir()
    shutil.copy(
        HTA / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        run / "traces" / "rank34.json.gz",
    )
    return run


@pytest.mark.corpus
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(changes=st.dictionaries(st.sampled_from(RUN_KEYS), JSON_VALUES, max_size=3))
def test_mutated_run_json_never_crashes(small_run: Path, changes: dict) -> None:
    base = {
        "schema_version": 1,
        "strategy": "dp",
        "world_size": 35,
        "status": "ok",
        "errors": [],
        "topology": [{"rank": 34, "node": 0, "host": "h", "local_rank": 0}],
    }
    (small_run / "run.json").write_text(json.dumps({**base, **changes}))
    try:
        result = analyze(small_run)
    except TracekitError as err:
        assert "\n" not in str(err) and "run.json" in str(err)
        return
    assert [r.rank for r in result.summary.ranks] == [34]
    assert result.summary.run is not None  # what summary.json echoes fits its schema
