"""Usage errors are one line, ``tracekit: <what>: <problem>``, exit 2 (#24): click's own form is a
4-line block (usage, hint, blank, error). Options of ``tracekit run`` are all checked before any
rank starts: nothing is created, no torchrun is started."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HTA, run_cli


def _one_line(proc, *words: str) -> str:
    err = proc.stderr
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("tracekit: "), err
    assert "Traceback" not in err and "Usage:" not in err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize(
    "args, words",
    [
        (("analyze", str(HTA), "--sample", "0"), ("--sample:", "0")),
        (("analyze", str(HTA), "--ranks-per-node", "0"), ("--ranks-per-node:",)),
        (("analyze",), ("PATH:", "Missing argument")),
        (("compare", "--bogus"), ("--bogus:", "No such option")),
        pytest.param(("run", "dp", "--nproc", "0"), ("--nproc:",), marks=pytest.mark.slow),
        pytest.param(("run", "dp", "--nproc", "65"), ("--nproc:", "64"), marks=pytest.mark.slow),
        pytest.param(
            ("run", "dp", "--precision", "fp9"), ("--precision:", "fp9"), marks=pytest.mark.slow
        ),
    ],
)
def test_click_errors_are_one_line(tmp_path: Path, args: tuple[str, ...], words) -> None:
    _one_line(run_cli(*args, "--out", str(tmp_path / "o"), timeout=60), *words)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # `tracekit run`: the conftest counts it as a job, though none starts
def test_pp_1f1b_on_3_ranks_is_refused_by_the_launcher(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = run_cli("run", "pp-1f1b", "--nproc", "3", "--out", str(out), timeout=120)
    _one_line(proc, "does not divide into 6 microbatches", "--microbatches")
    assert not out.exists()  # refused before a run folder (or a rank) existed


def test_unreadable_path_is_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        proc = run_cli("analyze", str(locked), "--out", str(tmp_path / "o"), as_user=True)
    finally:
        locked.chmod(0o755)
    _one_line(proc, str(locked))
