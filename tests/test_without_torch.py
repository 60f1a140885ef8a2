"""The analysis side runs where torch is not installed (issue #25 item 3): a subprocess with
torch blocked (``sys.modules["torch"] = None``: any ``import torch`` raises ImportError) imports
every analysis module, analyses a real sample run, writes its report and builds the app; and
``tracekit run`` there is one line saying how to get torch. pyproject.toml's import contracts
say the same statically (lint-imports); this is the run-time check."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT, SAMPLES

BLOCK = "import sys; sys.modules['torch'] = None\n"

ANALYSE = textwrap.dedent("""
    import importlib, pkgutil, sys
    from pathlib import Path
    import tracekit, dashboards
    analysis_side = ("tracekit.ingest", "tracekit.analyses", "tracekit.figures", "tracekit.report",
                     "tracekit.summary", "tracekit.strategies", "tracekit.timeline", "tracekit.analysis",
                     "tracekit.prediction", "tracekit.analysis_folder", "dashboards")
    names = [m.name for m in pkgutil.walk_packages([str(Path(tracekit.__file__).parent)], "tracekit.")]
    names += [m.name for m in pkgutil.walk_packages([str(Path(dashboards.__file__).parent)], "dashboards.")]
    for name in names:
        if name.startswith(analysis_side) and "._kscan" not in name:
            importlib.import_module(name)
    from tracekit.analysis import analyze
    from dashboards.app import create_app
    a = analyze(sys.argv[1])
    assert a.timeline.height > 0
    a.report(Path(sys.argv[2]))
    page = create_app(Path(sys.argv[1]).parent).server.test_client().get('/')
    assert page.status_code == 200, page.status_code
    assert 'torch' not in sys.modules or sys.modules['torch'] is None
    print("ok", len(names))
""")


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )


def test_the_analysis_runs_with_torch_blocked(tmp_path: Path):
    report = tmp_path / "dp.html"
    done = _python(ANALYSE, str(SAMPLES / "dp"), str(report), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok") and report.stat().st_size > 100_000


def test_run_without_torch_says_how_to_get_it(tmp_path: Path):
    code = "import sys; from tracekit.cli import run; sys.argv = ['tracekit', 'run', 'dp']; run()"
    done = _python(code, cwd=tmp_path)
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "needs torch" in lines[0] and "[runs]" in lines[0]
