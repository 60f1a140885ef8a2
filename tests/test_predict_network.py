"""tracekit predict against the real emulated network (Linux namespaces + tc tbf).

One module fixture makes the 8 runs of benchmarks/predict_validation.py (4 ranks on 2 nodes:
plain dp, fsdp, hsdp, pp-1f1b; dp at 400 mbit and 1 gbit, fsdp and hsdp at 400 mbit), each
shaped run is predicted from its plain run only, and the bounds of docs/predict.md are checked:
within 20 % of the measured step, the fsdp/hsdp order as measured, the replay within 5 % of
each run's own step, the pipeline bubble growing as the bandwidth falls.

Opt-in (``TRACEKIT_NETWORK_VALIDATION=1``, ``make validate-network``): on a shared 2-core
machine the emulation's own CPU cost and other load move a shaped run's compute by up to 2x,
so the 20 % bound held in 3 of 7 sets measured here (docs/predict.md "Validation": on a quiet
machine, set C, every prediction within 6 %). The prediction's own self-check runs in every
suite (tests/test_predict.py, on sample_traces/hsdp).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tracekit.capture import netns

pytestmark = [
    pytest.mark.slow,
    # 8 runs of 4 ranks, groups made again while another job skews their compute: minutes
    pytest.mark.timeout(3600),
    pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable())),
    pytest.mark.skipif(
        os.environ.get("TRACEKIT_NETWORK_VALIDATION") != "1",
        reason="opt-in: TRACEKIT_NETWORK_VALIDATION=1 (8 emulated-network runs, minutes; noisy "
        "on a loaded machine)",
    ),
]

_SPEC = importlib.util.spec_from_file_location(
    "predict_validation",
    Path(__file__).resolve().parents[1] / "benchmarks" / "predict_validation.py",
)
V = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(V)

BOUND = 0.20  # predicted step within 20 % of the measured one
SELF_BOUND = 0.05  # the replay at the run's own conditions within 5 %


@pytest.fixture(scope="module")
def validation(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # TRACEKIT_PREDICT_RUNS=DIR keeps the runs there (and reuses them when DIR/index.json exists)
    # (pairs whose compute differs by more than V.COMPARABLE are made again: V.make_runs)
    keep = os.environ.get("TRACEKIT_PREDICT_RUNS")
    existing = None
    if keep and (Path(keep) / "index.json").is_file():
        index = json.loads((Path(keep) / "index.json").read_text())
        existing = {k: Path(v) for k, v in index.items()}
    out = Path(keep) if keep else tmp_path_factory.mktemp("predict-runs")
    dirs = V.make_runs(out, V.STEPS, existing=existing)
    v = V.validate(dirs)
    print("\n" + V.report(v))
    return v


@pytest.mark.parametrize("run", [t for t, _, _ in V.PREDICTED])
def test_predicted_step_within_bound(validation: dict, run: str) -> None:
    row = next(r for r in validation["rows"] if r["run"] == run)
    assert abs(row["error"]) <= BOUND, row


def test_fsdp_hsdp_order_as_measured(validation: dict) -> None:
    o = validation["order"]
    assert o["plain_predicted"] == o["plain_measured"], o
    assert o["400mbit_predicted"] == o["400mbit_measured"], o


def test_crossover_where_the_order_flips(validation: dict) -> None:
    o = validation["order"]
    if o["plain_measured"] == o["400mbit_measured"]:
        pytest.skip(f"the measured order did not flip in these runs: {o}")
    xs = validation["crossover_bits_per_s"]
    assert xs, "the order flips between 400 mbit and unshaped, but the sweep finds no crossover"
    assert any(4e8 <= x <= 1e11 for x in xs), xs


@pytest.mark.parametrize("run", list(V.RUNS))
def test_own_conditions_give_the_measured_step(validation: dict, run: str) -> None:
    sc = validation["own"][run]
    assert abs(sc["error"]) <= SELF_BOUND, sc


def test_pipeline_bubble_grows_as_bandwidth_falls(validation: dict) -> None:
    bubbles = [r["bubble"] for r in validation["pp"]]  # PP_RATES: fastest first
    assert all(a <= b + 1e-9 for a, b in zip(bubbles, bubbles[1:])), validation["pp"]
    assert bubbles[-1] > bubbles[0] + 0.05, validation["pp"]
