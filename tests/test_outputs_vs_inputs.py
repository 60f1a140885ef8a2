"""Outputs never land on or inside an input (issue #24 item 2), and predict's output (item 6a).

Each case is a command of the issue's "Data loss" list or of its kind, run as a user runs it on
a copy of the committed DP sample run; afterwards the run's files are byte-identical and the
command said one line, exit status 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, one_line_error, run_cli

DP = SAMPLES / "dp"


def hashes(folder: Path) -> dict[str, str]:
    """Every file under FOLDER -> its sha256 (folders: their mode)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else oct(p.stat().st_mode)
        )
    return out


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """RUN and other: copies of the committed DP and TP sample runs (no analysis, no cache)."""
    skip = shutil.ignore_patterns("analysis", "*.events.parquet")
    shutil.copytree(DP, tmp_path / "RUN", ignore=skip)
    shutil.copytree(SAMPLES / "tp", tmp_path / "other", ignore=skip)
    return tmp_path


@pytest.mark.parametrize(
    "args,needle",
    [
        # the four cases
        ("report RUN -o RUN/traces/rank0.json.gz", "inside an input"),
        ("compare RUN other -o RUN/traces/rank1.json.gz", "inside an input"),
        ("report RUN -o RUN/run.json", "is an input"),
        ("report RUN --format perfetto -o RUN/traces/merged.json", "inside an input"),
        # the same for every other writer and input slot
        ("report RUN --format md -o RUN/memory/rank0.json", "inside an input"),
        ("report RUN --format json -o RUN/nccl/fr_rank0.json", "inside an input"),
        ("report RUN --format parquet -o RUN/train/x.parquet", "inside an input"),
        ("report RUN -o RUN/analysis/report.html", "inside an input"),  # report reads it
        ("compare other RUN -o other/run.json", "is an input"),
        ("analyze RUN --out RUN/traces/an", "inside an input"),
        ("analyze RUN --out RUN/traces/rank0.json.gz", "inside an input"),
        ("analyze RUN/traces/rank0.json.gz --out RUN/traces/rank0.json.gz", "is the input"),
        ("analyze RUN --cache-dir RUN/memory/c", "inside an input"),
        ("analyze RUN --cache-dir RUN/analysis/cache", "inside the analysis folder"),
        ("predict RUN --inter-node-bandwidth 1gbit --out RUN/traces", "inside an input"),
        ("predict RUN --inter-node-bandwidth 1gbit --out RUN/nccl/p", "inside an input"),
        # a folder of traces read as such: a .json output would be the next read's trace
        ("report RUN/traces --format json -o RUN/traces/r.json", "take this file for a trace"),
        # through a symlink to an input's folder: resolved first
        ("report RUN -o link/rank0.json.gz", "inside an input"),
        # another run's records, though this command does not read that run (the harm oracle's
        # draw: `report RUN -o RUN2/run.json` replaced RUN2's run.json)
        ("report RUN -o other/run.json", "inside the records of run"),
        ("report RUN --format md -o other/traces/notes.md", "inside the records of run"),
        ("report RUN --format json -o other/contention/r.json", "inside the records of run"),
    ],
)
def test_an_output_on_or_inside_an_input_is_refused(sandbox: Path, args: str, needle: str):
    (sandbox / "link").symlink_to(sandbox / "RUN" / "traces")
    before = {name: hashes(sandbox / name) for name in ("RUN", "other")}
    proc = run_cli(*args.split(), cwd=sandbox, timeout=120, env={"TRACEKIT_CACHE_DIR": "ucache"})
    one_line_error(proc, needle, "choose another place")
    assert {name: hashes(sandbox / name) for name in ("RUN", "other")} == before
    assert not (sandbox / "ucache").exists(), "refused before any work"


def test_a_report_in_the_run_folder_itself_is_written(sandbox: Path):
    """The run folder holds its inputs, but is not one: RUN/report.html is allowed (decided in
    docs/run-folder.md), and RUN/traces/ stays as it was."""
    before = hashes(sandbox / "RUN" / "traces")
    proc = run_cli(
        "report",
        "RUN",
        "-o",
        "RUN/report.md",
        cwd=sandbox,
        timeout=300,
        env={"TRACEKIT_CACHE_DIR": str(sandbox / "ucache")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (sandbox / "RUN" / "report.md").stat().st_size > 0
    assert hashes(sandbox / "RUN" / "traces") == before


# --- predict (issue #24 "More") and run/demo --out -------------------------------------------


def strict_json(path: Path) -> object:
    """PATH as strict JSON: NaN and Infinity are not JSON."""

    def refuse(name: str) -> object:
        raise ValueError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize(
    "option,value,needle",
    [
        ("--latency", "inf", "microseconds from 0 to 1e9"),
        ("--latency", "1e300", "microseconds from 0 to 1e9"),
        ("--latency", "nan", "microseconds from 0 to 1e9"),
        ("--inter-node-bandwidth", "1e300", "out of range"),
        ("--inter-node-bandwidth", "1e-300", "not a rate"),
    ],
)
def test_predict_refuses_values_that_are_not_finite(sandbox: Path, option, value, needle):
    args = {"--inter-node-bandwidth": "1gbit", option: value}
    argv = [a for kv in args.items() for a in kv]
    proc = run_cli("predict", "RUN", *argv, cwd=sandbox, timeout=120)
    one_line_error(proc, needle)
    assert not (sandbox / "RUN" / "analysis").exists(), "nothing written"


def test_predict_keeps_runs_of_one_name_apart_and_the_next_analyze_accepts_its_folder(
    sandbox: Path,
):
    env = {"TRACEKIT_CACHE_DIR": str(sandbox / "ucache")}
    shutil.copytree(sandbox / "RUN", sandbox / "a" / "run1")
    shutil.copytree(sandbox / "other", sandbox / "b" / "run1")
    proc = run_cli(
        "predict",
        "a/run1",
        "b/run1",
        "--inter-node-bandwidth",
        "1gbit",
        "--out",
        "P",
        cwd=sandbox,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = sorted((sandbox / "P").glob("*.prediction.json"))
    assert len(written) == 2, written
    sources = {str(strict_json(p)["source"]) for p in written}  # type: ignore[index]
    assert len(sources) == 2, sources
    # predict into a run that has no analysis yet, then analyze: not refused, and again
    for args in (
        ["predict", "RUN", "--inter-node-bandwidth", "100mbit:10gbit", "--latency", "5"],
        ["analyze", "RUN"],
        ["predict", "RUN", "--inter-node-bandwidth", "1gbit"],
        ["analyze", "RUN"],
    ):
        proc = run_cli(*args, cwd=sandbox, timeout=300, env=env)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
    strict_json(sandbox / "RUN" / "analysis" / "summary.json")


def test_predict_on_a_full_disk_leaves_nothing(sandbox: Path):
    """A file-size limit (RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC) under --out: one
    line, and no folder made for it is left."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # the marker fits, not the JSON

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracekit.cli",
            "predict",
            "RUN",
            "--inter-node-bandwidth",
            "1gbit",
            "--out",
            "Q/deep/p",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=sandbox,
        preexec_fn=limit,
        env=dict(os.environ, TRACEKIT_CACHE_DIR=str(sandbox / "ucache"), PYTHONPATH=str(ROOT)),
    )
    one_line_error(proc, "cannot write here (File too large)", "--out")
    assert not (sandbox / "Q").exists()


@pytest.mark.parametrize("command", ["run dp", "demo", "run dp --nproc 2"])
@pytest.mark.parametrize("out", ["afile", "afile/sub"])
def test_run_and_demo_out_naming_a_file(sandbox: Path, command: str, out: str, capsys, monkeypatch):
    """In this process (tracekit.cli.main, the console script's own entry): it is refused
    before any job starts, so the fast tier may run it."""
    from tracekit.cli import main

    (sandbox / "afile").write_text("mine\n")
    monkeypatch.chdir(sandbox)
    with pytest.raises(SystemExit) as done:
        main([*command.split(), "--out", out])
    err = capsys.readouterr().err
    proc = subprocess.CompletedProcess([], done.value.code, "", err)
    one_line_error(proc, "not a folder: run folders go into a folder")
    assert (sandbox / "afile").read_text() == "mine\n"
    assert sorted(p.name for p in sandbox.iterdir()) == ["RUN", "afile", "other"]


# --- a folder from before the marker (issue #24 item 1) --------------------------------------


@pytest.mark.parametrize(
    "files,replaced",
    [
        (["summary.json", "mydata.parquet"], False),  # the case: the user's table
        (["summary.json", "ranks.parquet", "notes.txt"], False),
        (["summary.json", "ranks.parquet", "events/rank0.parquet", "events/mine.csv"], False),
        (
            ["summary.json", "ranks.parquet", "events.parquet", "cache/rank0-ab.events.parquet"],
            True,
        ),
        (["summary.json", "collectives.parquet", "timeline/rank1.parquet"], True),
    ],
)
def test_a_folder_from_before_the_marker(sandbox: Path, files: list[str], replaced: bool):
    legacy = sandbox / "legacy"
    for name in files:
        (legacy / name).parent.mkdir(parents=True, exist_ok=True)
        (legacy / name).write_text(f"{name}\n")
    before = hashes(legacy)
    env = {"TRACEKIT_CACHE_DIR": str(sandbox / "ucache")}
    proc = run_cli("analyze", "RUN", "--out", "legacy", cwd=sandbox, timeout=300, env=env)
    if replaced:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (legacy / ".tracekit-analysis").is_file()
    else:
        one_line_error(proc, "is not an analysis folder")
        assert hashes(legacy) == before


def test_the_analysis_files_list_names_every_table_an_analysis_writes():
    from tracekit.analyses import manifest
    from tracekit.analysis_folder import ANALYSIS_TABLES

    written = {name for section in manifest.SECTIONS for name in (section.frames or {})}
    assert written and written <= ANALYSIS_TABLES, written - ANALYSIS_TABLES


# --- temporary files: in a private folder of ours (issue #24 item 1) -------------------------


def test_the_scratch_folder_leaves_other_programs_temporary_files_alone(sandbox: Path):
    """A job over the memory budget spills per-rank results into a folder it makes (with its
    owner marker) in TMPDIR; other programs' files there, named like ours, stay byte-identical,
    and the scratch folder is gone after."""
    tmp = sandbox / "faketmp"
    (tmp / ".session.old-77777").mkdir(parents=True)
    (tmp / ".session.old-77777" / "state").write_text("session\n")
    (tmp / ".build.tmp-55555-xyz").mkdir()
    (tmp / ".build.tmp-55555-xyz" / "obj.o").write_bytes(b"\x7fELF")
    (tmp / ".queue.88888-job.tmp").write_text("job\n")
    (tmp / ".tracekit-spill.tmp-99999-deadbeef").mkdir()  # ours by name, not by marker
    before = hashes(tmp)
    env = {
        "TMPDIR": str(tmp),
        "TRACEKIT_MEMORY_BUDGET": "1",
        "TRACEKIT_CACHE_DIR": str(sandbox / "ucache"),
    }
    proc = run_cli("analyze", "RUN", "--out", "an", cwd=sandbox, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert hashes(tmp) == before
