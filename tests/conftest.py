"""Shared test fixtures: paths to the real traces and the committed sample runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTA = ROOT / "tests" / "data" / "corpus" / "hta"
SAMPLES = ROOT / "sample_traces"


def run_cli(
    *args: str, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`tracekit ARGS` in a subprocess, exactly as a user runs it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )


@pytest.fixture(scope="session")
def hta() -> Path:
    return HTA
