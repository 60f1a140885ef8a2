"""The why analysis against stragglers we plant (issue #28's ground truth; slow tier).

One module fixture makes benchmarks/straggler_validation.py's runs: dp, fsdp and pp-1f1b at 2
ranks, each as is and with ``--straggler 1:2`` (real gloo jobs, real traces). Per strategy and
claim, the issue's bounds: the top cause is rank 1; the waits charged to it are within 25 % of
the extra compute run.json says it ran; the critical path's largest share is rank 1's, compute
its main state; ``predict --without-straggler`` gives the clean run's step within 15 %.

The two structural claims (top cause, path) are asserted at the issue's bounds. The two timed
ones compare runs made one after the other on a shared 2-CPU machine, where another job and the
machine itself move them: the peer's own work per step moved -21 % to +15 % between a clean run
and the straggler run after it (four idle-machine runs of the benchmark), and CI at load 1.5 once
put dp's charges at -80 % and pp's what-if at +48 % (with the straggler's extra paid only at
its phases' ends, then).
The suite asserts behaviour, not timings (issue #25): here the timed claims are held to what no
noise explains (charges beyond the clean run's are positive and at most twice the injected;
the what-if is faster than the straggler run and no faster than the clean run's half);
benchmarks/straggler_validation.py checks the issue's own bounds, and its table, with the load
and the peer's slowdown, is what the closing note reports.
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
    why = f"{claim} not met (load {load}): {json.dumps(row)}"
    assert row["injected_per_step_s"] and min(row["injected_per_step_s"]) > 0, why
    if claim in ("top cause", "path"):
        assert sv.verdicts(row)[claim], why
    elif claim == "charged":
        beyond = row["charged_s"] - row["clean_charged_s"]
        assert 0 < beyond <= 2 * row["injected_s"], why
    else:
        assert row["clean_step_s"] / 2 <= row["without_s"] < row["straggler_step_s"], why
