"""The CLI as a user meets it: one-line errors with exit status 2, no traceback, nothing half-written."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import HTA, run_cli


def assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("tracekit: ")
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_folder(tmp_path):
    proc = run_cli("analyze", str(tmp_path / "nope"))
    assert_one_line_error(proc, "nope", "no such file")


def test_folder_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    proc = run_cli("analyze", str(tmp_path))
    assert_one_line_error(proc, str(tmp_path), "no Kineto trace")


@pytest.mark.parametrize(
    "name,content",
    [
        ("empty.json.gz", b""),
        (
            "truncated.json.gz",
            gzip.compress(json.dumps({"traceEvents": [{"ph": "X"}] * 50}).encode())[:40],
        ),
        ("corrupt.json.gz", b"\x1f\x8b\x08\x00garbage-garbage-garbage"),
        ("truncated.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2'),
        ("not_a_trace.json", b'{"hello": "world"}'),
        ("a_list.json", b"[1, 2, 3]"),
    ],
)
def test_bad_trace_files(tmp_path, name, content):
    f = tmp_path / name
    f.write_bytes(content)
    proc = run_cli("analyze", str(f))
    assert_one_line_error(proc, name)
    assert not (tmp_path / (name + ".analysis")).exists(), "nothing half-written"
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_damaged_run_json(tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "run.json").write_text("{not json")
    proc = run_cli("analyze", str(run))
    assert_one_line_error(proc, "run.json", "damaged")


@pytest.fixture
def read_only_traces(tmp_path):
    """A read-only copy of HTA's trace_filter (a shared archive of someone else's traces)."""
    folder = tmp_path / "archive" / "trace_filter"
    skip = shutil.ignore_patterns("analysis", "*.events.parquet")
    shutil.copytree(HTA / "trace_filter", folder, ignore=skip)
    folder.chmod(0o555)
    folder.parent.chmod(0o555)
    yield folder
    folder.parent.chmod(0o755)
    folder.chmod(0o755)


@pytest.mark.corpus
def test_unwritable_output_suggests_out(read_only_traces):
    proc = run_cli(
        "analyze", str(read_only_traces), "--out", str(read_only_traces.parent / "a"), as_user=True
    )
    assert_one_line_error(proc, "--out")


@pytest.mark.corpus
def test_read_only_input_folder_needs_out_and_works_with_it(read_only_traces, tmp_path):
    """Writing beside a read-only folder fails clearly, --out works, the cache goes to the
    cache folder: the archive is left as it was."""
    refused = run_cli("analyze", str(read_only_traces), as_user=True)
    assert_one_line_error(refused, "--out", "read-only")
    names = ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"]
    assert sorted(p.name for p in read_only_traces.iterdir()) == names
    out = tmp_path / "analysis"
    proc = run_cli("analyze", str(read_only_traces), "--out", str(out), as_user=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    for table in ("ranks", "collectives"):
        assert (out / f"{table}.parquet").is_file()
    for table in ("timeline", "events"):  # per rank
        assert sorted(p.name for p in (out / table).iterdir()) == ["rank0.parquet", "rank1.parquet"]
    assert "rank" in proc.stdout and "compute" in proc.stdout
    assert sorted(p.name for p in read_only_traces.iterdir()) == names
    assert len(list(Path(os.environ["TRACEKIT_CACHE_DIR"]).glob("*.events.parquet"))) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], (
        "no temporary folders left"
    )


def test_unknown_command_and_bad_option_exit_2():
    assert run_cli("frobnicate").returncode == 2
    assert run_cli("analyze", str(HTA), "--ranks", "x,y").returncode == 2
