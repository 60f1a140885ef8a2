"""A run folder met while searching a folder for traces is read as when named itself: its
traces/ only, never its side files (contention/rank<R>.json, a job's own JSON beside run.json),
which are named like traces."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from tracekit.cli import cli
from tracekit.runfolder import find_trace_files

DP = Path(__file__).resolve().parents[1] / "sample_traces" / "dp"


def _nested(tmp_path: Path) -> tuple[Path, Path]:
    parent = tmp_path / "runs"
    run = parent / "run1"
    shutil.copytree(DP, run, ignore=shutil.ignore_patterns("analysis"))
    (run / "contention").mkdir(exist_ok=True)
    (run / "contention" / "rank0.json").write_text('{"rank": 0, "waits": []}')
    (run / "straggler.json").write_text('{"factor": 3}')
    (run / "traces" / "old").mkdir()
    shutil.copy(run / "traces" / "rank0.json.gz", run / "traces" / "old" / "rank0.json.gz")
    return parent, run


def test_a_run_inside_the_searched_folder_gives_its_traces_only(tmp_path: Path) -> None:
    parent, run = _nested(tmp_path)
    assert find_trace_files(parent) == find_trace_files(run)
    assert find_trace_files(run) == sorted((run / "traces").glob("rank*.json.gz"))


def test_analysing_the_folder_of_runs_warns_of_no_side_file(tmp_path: Path) -> None:
    parent, _ = _nested(tmp_path)
    res = CliRunner().invoke(
        cli, ["analyze", str(parent), "--no-cache", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    assert "not a Kineto trace" not in res.output, res.output
