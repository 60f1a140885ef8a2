"""The papers' claims checked on the committed sample runs (tracekit.report.claims, #27).

The oracle is summary.json read as plain JSON, with each claim's rule written out here again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec
import pytest

from tracekit.analysis import analyze
from tracekit.report import write_report
from tracekit.report.claims import FAILS, HOLDS, NOISE, claims

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
NAMES = ("dp", "zero1", "zero2", "zero3", "pp-gpipe", "pp-1f1b", "pp-pipedream")


@pytest.fixture(scope="module")
def runs() -> dict:
    return {n: analyze(SAMPLES / n) for n in NAMES}


def _json(a) -> dict:
    return json.loads(msgspec.json.encode(a.summary))


def test_each_claim_agrees_with_the_summaries(runs: dict) -> None:
    by = {c.claim: c for c in claims(list(runs.values()))}
    gp, fb, pd = (_json(runs[n]) for n in ("pp-gpipe", "pp-1f1b", "pp-pipedream"))
    gap = gp["pipeline"]["bubble_fraction"] - gp["pipeline"]["bubble_fraction_replay"]
    assert by["GPipe's bubble is the schedule's"].verdict == (HOLDS if abs(gap) <= 0.1 else FAILS)

    def peak(s: dict) -> int:
        return max(r["activation_peak_bytes"] for r in s["memory"]["per_rank"])

    assert by["1F1B keeps fewer activations than GPipe"].verdict == (
        HOLDS if peak(fb) < peak(gp) else FAILS
    )
    span = pd["pipeline"]["bubble_fraction_span"] < gp["pipeline"]["bubble_fraction_span"]
    assert by["PipeDream is busier than GPipe (no flush)"].verdict == (HOLDS if span else FAILS)
    vol = {n: _json(runs[n])["volume"]["ideal_bytes_per_rank_per_step"] for n in ("dp", "zero3")}
    ratio = vol["zero3"] / vol["dp"]
    c = by["ZeRO-3 moves 1.5x DP's bytes"]
    assert f"{ratio:.2f}x" in c.measured and c.verdict == (
        HOLDS if abs(ratio - 1.5) <= 0.1 else FAILS
    )
    zero = by["ZeRO's model states per rank follow the formula"]
    for n in ("dp", "zero1", "zero2", "zero3"):
        assert f"{n} {_json(runs[n])['memory']['ratio_to_theory']:.3f}x" in zero.measured
    # one zero3 sample (prefetch 1): no prefetch claim without its pair
    assert not [k for k in by if "prefetch" in k]


def test_prefetch_within_noise_and_the_measured_reason(runs: dict) -> None:
    """zero3 with and without prefetch: overlapping step ranges are "within noise"; a slower
    prefetch run that did not overlap is "does not hold" with the loopback reason."""
    on = runs["zero3"]
    steps = on.summary.steps
    assert steps is not None and on.summary.overlap is not None

    def variant(prefetch: int, scale: float, hidden: float):
        s = msgspec.structs.replace(
            on.summary,
            steps=msgspec.structs.replace(
                steps,
                median_s=steps.median_s * scale,
                min_s=steps.min_s * scale,
                max_s=steps.max_s * scale,
            ),
            overlap=msgspec.structs.replace(on.summary.overlap, allgather_hidden_fraction=hidden),
        )
        config = {**on.run["config"], "strategy_options": {"prefetch": prefetch}}
        return dataclasses.replace(on, summary=s, run={**on.run, "config": config})

    same = {c.claim: c for c in claims([variant(0, 1.0, 0.1), variant(1, 1.0, 0.6)])}
    assert same["ZeRO-3 prefetch hides the all-gathers"].verdict == HOLDS
    assert same["ZeRO-3 prefetch shortens the step"].verdict == NOISE
    far = 1.01 * steps.max_s / steps.min_s
    slow = {c.claim: c for c in claims([variant(0, 1.0, 0.1), variant(1, far, 0.6)])}
    c = slow["ZeRO-3 prefetch shortens the step"]
    assert c.verdict == FAILS and "CPU work" in (c.why or "")
    fast = {c.claim: c for c in claims([variant(0, far, 0.1), variant(1, 1.0, 0.05)])}
    assert fast["ZeRO-3 prefetch shortens the step"].verdict == HOLDS
    assert fast["ZeRO-3 prefetch hides the all-gathers"].verdict == FAILS


def test_the_comparison_report_lists_them(runs: dict, tmp_path: Path) -> None:
    chosen = [runs["pp-gpipe"], runs["pp-1f1b"]]
    md = write_report(chosen, tmp_path / "c.md", "md", names=["g", "f"]).read_text()
    assert "### the papers' claims on these runs" in md
    assert "- 1F1B keeps fewer activations than GPipe: peak " in md
    page = write_report(chosen, tmp_path / "c.html", "html", names=["g", "f"]).read_text()
    assert '<ul class="claims">' in page and "1F1B keeps fewer activations" in page


def test_a_corun_slowdown_is_a_measured_reason(runs: dict) -> None:
    """A claim within noise names the co-run probe's figure when ranks slowed each other's
    compute past the warning's bound (tracekit.capture.corun), and not below it."""
    from tracekit.summary.contention import Contention

    on = runs["zero3"]

    def with_corun(prefetch: int, slowdown: float):
        c = Contention(ranks=2, machine_cores=2, local_ranks=2, cpu_wait_share_max=0.05,
                       inflated=[], unavailable=None, per_rank=[], corun_slowdown_max=slowdown)  # fmt: skip
        s = msgspec.structs.replace(on.summary, contention=c)
        config = {**on.run["config"], "strategy_options": {"prefetch": prefetch}}
        return dataclasses.replace(on, summary=s, run={**on.run, "config": config})

    what = "ZeRO-3 prefetch shortens the step"
    slowed = {c.claim: c for c in claims([with_corun(0, 1.9), with_corun(1, 1.9)])}[what]
    assert slowed.verdict == NOISE and "compute took 1.90x its time alone" in (slowed.why or "")
    calm = {c.claim: c for c in claims([with_corun(0, 1.1), with_corun(1, 1.1)])}[what]
    assert "compute took" not in (calm.why or "")
