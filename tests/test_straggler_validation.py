"""The why analysis against stragglers we plant (issue #28's ground truth; slow tier).

One module fixture makes benchmarks/straggler_validation.py's runs: dp, fsdp and pp-1f1b at 2
ranks, each as is and with ``--straggler 1:2`` (real gloo jobs, real traces). Per strategy and
claim, the issue's bounds: the top cause is rank 1; the waits charged to it are within 25 % of
the extra compute run.json says it ran; the critical path's largest share is rank 1's, compute
its main state; ``predict --without-straggler`` gives the clean run's step within 15 %.

The two timed claims compare runs made one after the other on a shared machine, so another job
moves them (measured here at load 4-15: the peers' own work per step changed 0.5-2x between two
runs a minute apart). The suite asserts behaviour, not timings (issue #25): here the timed
claims hold within twice the issue's bounds; benchmarks/straggler_validation.py checks the
issue's own bounds, and its table, with the load, is what the closing note reports.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "straggler_validation",
    Path(__file__).resolve().parents[1] / "benchmarks" / "straggler_validation.py",
)
assert _SPEC is not None and _SPEC.loader is not None
sv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sv)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("straggler")
    index = sv.make_runs(out, steps=3, factor=2.0)
    return {s: sv.check(Path(v["clean"]), Path(v["straggler"])) for s, v in index.items()}


@pytest.mark.parametrize("strategy", sv.STRATEGIES)
@pytest.mark.parametrize("claim", ["top cause", "charged", "path", "without"])
def test_claim(rows: dict[str, dict[str, Any]], strategy: str, claim: str) -> None:
    row = rows[strategy]
    load = Path("/proc/loadavg").read_text().split()[:3]
    assert row["injected_s"] > 0.1  # the straggler really ran extra compute
    loose = claim in ("charged", "without")  # timed: twice the bounds (docstring)
    ok = sv.verdicts(row, slack=2.0 if loose else 1.0)[claim]
    assert ok, f"{claim} not met (load {load}): {json.dumps(row)}"
