"""The wall-clock bounds the test suite used to assert (issue #25 item 2), as one benchmark.

    python benchmarks/timing_bounds.py                 # parse, figures, NCCL logs (~1 min)
    python benchmarks/timing_bounds.py --pipeline      # + two real pipeline runs (4 + 2 ranks)
    python benchmarks/timing_bounds.py --dash          # + the Chromium timeline tests' numbers

A shared, loaded machine cannot judge wall time (3126 ms against 3000 ms, 0.1203 against 0.12
failed there), so the suite asserts what the code does and these bounds live here: each line
prints the measured value, its bound and "ok" / "OVER"; exit 1 if any is over. Run it on a quiet
machine. The tests they came from still check the behaviour (same result, same payload size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests.*: its builders and data

RESULTS: list[tuple[str, float, float, str]] = []


def check(what: str, value: float, bound: float, unit: str) -> None:
    RESULTS.append((what, value, bound, unit))
    state = "ok" if value < bound else "OVER"
    print(f"{what}: {value:.4g} {unit} (bound {bound:g}) {state}", flush=True)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def parse_and_figures() -> None:
    from tests.builders.analyses import big_timeline
    from tests.builders.traces import NCCL_DATA
    from tracekit import figures as F
    from tracekit.ingest import read_trace

    # was tests/test_ingest.py test_parse_time_nccl_data: about 0.15 s (HTA ~0.8 s)
    read_trace(NCCL_DATA)
    check("parse nccl_data.json.gz (warm)", timed(lambda: read_trace(NCCL_DATA)), 3.0, "s")
    # was tests/test_figures.py test_big_timeline_builds_fast
    ev, tl = big_timeline(64, 1_000_000)
    check("64x1M timeline overview build", timed(lambda: F.timeline_overview(tl)), 2.0, "s")
    check(
        "64x1M timeline detail build",
        timed(lambda: F.timeline_detail(tl, 0.2, 0.2004, events=ev)),
        2.0,
        "s",
    )


def nccl_logs() -> None:
    from tests.test_nccl_log import IB_16
    from tracekit.ingest.nccl_log import read_nccl_logs

    with tempfile.TemporaryDirectory() as tmp:
        # was tests/test_nccl_log.py test_a_huge_nranks_is_not_listed_rank_by_rank
        line = (
            "h:1:2 [0] NCCL INFO comm 0x1 rank 5 nRanks 999999999 nNodes 9 localRanks 8 localRank 5"
        )
        one = Path(tmp) / "x.log"
        one.write_text(line + "\n")
        check("NCCL log claiming 10^9 ranks", timed(lambda: read_nccl_logs(one)), 5.0, "s")
        # was test_large_log_streams_linearly: ~120k lines
        big = Path(tmp) / "big.log"
        big.write_bytes(IB_16.read_bytes() * 4000)
        check("NCCL log of ~120k lines", timed(lambda: read_nccl_logs(big)), 20.0, "s")


def pipeline() -> None:
    """was tests/test_pipeline_runs.py: measured bubble - replayed bubble, which is what p2p and
    thread wake-ups on a busy machine add (0.05-0.09 for GPipe p=4 m=8 on 2 shared cores)."""
    from tracekit.analysis import analyze
    from tracekit.capture.launch import run_job
    from tracekit.strategies.options import RunOptions

    with tempfile.TemporaryDirectory() as tmp:
        for name, nproc, micro, bound in (("pp-gpipe", 4, 8, 0.12), ("pp-1f1b", 2, None, 0.06)):
            run = run_job(
                RunOptions(name, nproc=nproc, steps=2, warmup=1, microbatches=micro, out=Path(tmp))
            )
            pipe = analyze(run).summary.pipeline
            assert pipe is not None and pipe.bubble_fraction is not None
            check(
                f"{name} p={nproc}: measured bubble - replay",
                pipe.bubble_fraction - pipe.bubble_fraction_replay,
                bound,
                "",
            )


#: was tests/test_dash.py's asserts (ms; issue #8's targets: first draw 2 s, zoom 1 s)
DASH_BOUNDS = {
    "4-rank timeline: Plotly draw of the figure": 2000,
    "64-rank 1M-event timeline: navigation to drawn heatmap, cold (figures built)": 3000,
    "64-rank 1M-event timeline: navigation to drawn heatmap, figures built, browser warm": 2500,
    "64-rank 1M-event timeline: navigation to drawn heatmap, warm": 2000,
    "64-rank 1M-event timeline: Plotly draw of the figure": 1000,
    "64-rank zoom to a wide window (binned)": 2500,
    "64-rank zoom to detail bars": 1500,
    "64-rank back to the overview (double-click)": 2500,
}


def dash() -> None:
    """Run the Chromium timeline tests; they write what they measured to TRACEKIT_MEASURED_JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "tests/test_dash.py",
                "-k",
                "first_draw or 64_ranks",
            ],
            cwd=ROOT,
            env=dict(os.environ, TRACEKIT_MEASURED_JSON=str(out)),
            check=True,
        )
        measured = json.loads(out.read_text())
    for what, bound in DASH_BOUNDS.items():
        check(what, float(measured[what].split()[0]), bound, "ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", action="store_true", help="also two real pipeline runs")
    p.add_argument("--dash", action="store_true", help="also the Chromium timeline tests")
    a = p.parse_args()
    parse_and_figures()
    nccl_logs()
    if a.pipeline:
        pipeline()
    if a.dash:
        dash()
    over = [r for r in RESULTS if r[1] >= r[2]]
    print(f"{len(RESULTS) - len(over)} of {len(RESULTS)} within their bounds")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
