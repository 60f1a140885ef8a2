"""ZeRO stages 1-3, end to end: real 2-rank gloo jobs checked against single-process training,
against ZeRO's memory and volume formulas, and for ZeRO-3's prefetch schedule in the trace.

Runs (each reused by many assertions): zero1, zero2, zero3 (prefetch 1, the default) in fp32 with
2 profiled steps after 1 warm-up step; zero3 --prefetch 0; one short bf16-mixed run per stage. The formulas hold
for any N, so world size 2 checks them; benchmarks/zero_stages.py measures world size 4.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import torch
from conftest import SAMPLES

from instrumented_runs.harness import parse_args
from instrumented_runs.model import GPTConfig
from instrumented_runs.single import train_single
from tracekit import capture, runfolder, theory
from tracekit.analysis import Analysis, analyze
from tracekit.capture.launch import RunOptions, run_job, validate
from tracekit.errors import TracekitError
from tracekit.strategies.registry import STRATEGIES
from tracekit.summary import Summary

pytestmark = pytest.mark.slow

STEPS, WARMUP, N = 2, 1, 2
CFG = GPTConfig()
PSI = CFG.n_params()
UNITS = CFG.n_layers + 2  # embeddings, blocks, head


def _run(tmp_path_factory: pytest.TempPathFactory, strategy: str, **options) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEKIT_SAVE_PARAMS", "1")
        run = run_job(
            RunOptions(
                strategy, nproc=N, warmup=WARMUP, out=tmp_path_factory.mktemp("runs"), **options
            )
        )
    data = runfolder.load_run_json(run)
    assert data is not None and data["status"] == "ok", data
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {s: _run(tmp_path_factory, s, steps=STEPS) for s in ("zero1", "zero2", "zero3")}


@pytest.fixture(scope="module")
def zero3_p0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory, "zero3", steps=2, prefetch=0)


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # bf16 matmuls are slow on CPU: one profiled step after the warm-up (the memory step is step 1)
    return {
        s: _run(tmp_path_factory, s, steps=1, precision="bf16-mixed")
        for s in ("zero1", "zero2", "zero3")
    }


@pytest.fixture(scope="module")
def analyses(runs: dict[str, Path]) -> dict[str, Analysis]:
    return {s: analyze(r) for s, r in runs.items()}


@pytest.fixture(scope="module")
def dp_sample() -> Summary:
    return analyze(SAMPLES / "dp").summary


@functools.cache
def _single(steps: int, precision: str = "fp32", accumulate: int = 1) -> tuple[list[float], dict]:
    return train_single(steps, precision=precision, accumulate=accumulate)


def _losses(run: Path, rank: int) -> list[float]:
    return json.loads(runfolder.train_path(run, rank).read_text())["losses"]


def _mean_losses(run: Path) -> list[float]:
    return [sum(step) / N for step in zip(*(_losses(run, r) for r in range(N)))]


def _memory(run: Path, rank: int) -> dict:
    return json.loads(runfolder.memory_path(run, rank).read_text())


def _padded_numels(run: Path) -> list[int]:
    """Flat-group sizes after padding to a multiple of N (what each stage partitions)."""
    opts = runfolder.load_run_json(run)["config"]["strategy_options"]
    groups = opts.get("units") or opts.get("buckets") or [opts["flat"]]
    return [g["padded"] for g in groups]


# --- equivalence with single-process training ----------------------------------------------------


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_fp32_losses_and_parameters_match_single_process(
    runs: dict[str, Path], strategy: str
) -> None:
    run = runs[strategy]
    ref, _ = _single(WARMUP + STEPS)
    losses = _mean_losses(run)
    assert len(losses) == WARMUP + STEPS
    for got, want in zip(losses, ref):
        assert abs(got - want) <= 1e-5 * abs(want)
    # Adam on a flat shard is the same elementwise arithmetic as on the tensors: parameters agree
    # with the N-slice accumulation of single-process training as tightly as DP's do (test_dp).
    _, same_arith = _single(WARMUP + STEPS, accumulate=N)
    p0, p1 = capture.load_params(run, 0), capture.load_params(run, 1)
    assert p0.keys() == same_arith.keys()
    for name, want in same_arith.items():
        torch.testing.assert_close(
            p0[name], p1[name], rtol=0, atol=0
        )  # every rank holds the same model
        torch.testing.assert_close(p0[name], want, rtol=1e-5, atol=1e-8, msg=name)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_bf16_mixed_matches_single_process(bf16_runs: dict[str, Path], strategy: str) -> None:
    run = bf16_runs[strategy]
    assert runfolder.load_run_json(run)["precision"] == "bf16-mixed"
    ref, _ = _single(WARMUP + 1, precision="bf16-mixed")
    for got, want in zip(_mean_losses(run), ref, strict=True):
        assert abs(got - want) <= 1e-2 * abs(want)  # docs/strategies.md: bf16-mixed within 1e-2
    params = capture.load_params(run, 0)
    assert all(p.dtype == torch.bfloat16 for p in params.values())


# --- memory: counted from the tensors, compared with ZeRO's formulas --------------------------------

# bytes per (padded) element: (params, grads, optimizer) and which of them are sharded by N
LAYOUT = {
    ("zero1", "fp32"): ((4, False), (4, False), (8, True)),
    ("zero2", "fp32"): ((4, False), (4, True), (8, True)),
    ("zero3", "fp32"): ((4, True), (4, True), (8, True)),
    ("zero1", "bf16-mixed"): ((2, False), (2, False), (12, True)),
    ("zero2", "bf16-mixed"): ((2, False), (2, True), (12, True)),
    ("zero3", "bf16-mixed"): ((2, True), (2, True), (12, True)),
}


def _check_memory(run: Path, strategy: str, precision: str) -> None:
    padded = sum(_padded_numels(run))
    assert PSI <= padded < PSI + N * UNITS * 4
    n_step_counters = len(_padded_numels(run))  # Adam keeps one 4-byte step per flat shard
    for rank in range(N):
        mem = _memory(run, rank)
        assert mem["step"] == 1
        want = [
            size * padded // (N if sharded else 1)
            for size, sharded in LAYOUT[(strategy, precision)]
        ]
        assert mem["params_bytes"] == want[0]
        assert mem["grads_bytes"] == want[1]
        assert mem["optimizer_bytes"] == want[2] + 4 * n_step_counters
        assert (
            mem["model_states_bytes"]
            == mem["params_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]
        )
        expected = theory.model_states_bytes(strategy, precision, PSI, N)["model_states_bytes"]
        assert mem["model_states_bytes"] == pytest.approx(expected, rel=1e-3)
        assert mem["activation_peak_bytes"] > 0


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_fp32_memory_matches_formula(runs: dict[str, Path], strategy: str) -> None:
    _check_memory(runs[strategy], strategy, "fp32")


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_bf16_memory_is_the_k12_formula(bf16_runs: dict[str, Path], strategy: str) -> None:
    _check_memory(bf16_runs[strategy], strategy, "bf16-mixed")
    mem = _memory(bf16_runs[strategy], 0)
    assert (
        mem["optimizer_bytes_by_key"]["master"] == 4 * sum(_padded_numels(bf16_runs[strategy])) // N
    )


def test_memory_ratios_to_dp_match_the_formulas(
    analyses: dict[str, Analysis], dp_sample: Summary
) -> None:
    """model_states_bytes of each stage over DP's (the committed 2-rank dp sample, same model)."""
    assert dp_sample.memory is not None
    dp = dp_sample.memory.per_rank[0].model_states_bytes
    for strategy, result in analyses.items():
        mem = result.summary.memory
        assert (
            mem.theory.formula
            == {"zero1": "8Psi+8Psi/N", "zero2": "4Psi+12Psi/N", "zero3": "16Psi/N"}[strategy]
        )
        formula_ratio = (
            mem.theory.model_states_bytes
            / theory.model_states_bytes("dp", "fp32", PSI, N)["model_states_bytes"]
        )
        for row in mem.per_rank:
            assert row.model_states_bytes / dp == pytest.approx(formula_ratio, rel=0.05)
            assert row.ratio_to_theory == pytest.approx(1.0, rel=1e-3)
            assert row.peak_bytes > 0 and row.activation_peak_bytes > 0


def test_activations_exclude_gathered_parameters(runs: dict[str, Path]) -> None:
    """Same model, same batch slice: the activations saved for backward do not depend on the stage
    (ZeRO-3's gathered weights, saved by autograd too, are parameters, not activations)."""
    peaks = {s: _memory(r, 0)["activation_peak_bytes"] for s, r in runs.items()}
    assert len(set(peaks.values())) == 1, peaks


# --- communication volume --------------------------------------------------------------------------


def test_ideal_volume_per_rank_relative_to_dp(
    analyses: dict[str, Analysis], dp_sample: Summary
) -> None:
    dp = dp_sample.collectives.ideal_bytes_per_rank_per_step
    assert dp == pytest.approx(2 * 4 * PSI * (N - 1) / N, rel=1e-6)
    want = {"zero1": 1.0, "zero2": 1.0, "zero3": 1.5}
    for strategy, result in analyses.items():
        summary = result.summary
        ideal = summary.collectives.ideal_bytes_per_rank_per_step
        assert ideal / dp == pytest.approx(want[strategy], rel=0.05), strategy
        volume = summary.volume
        assert volume.ideal_bytes_per_rank_per_step == pytest.approx(ideal, rel=1e-9)
        # gloo sends each reduce-scatter as a full all-reduce: twice the ideal for that half
        rs = sum(o.ideal_bytes_per_step for o in volume.per_op if o.op == "reduce_scatter")
        assert volume.wire_bytes_per_rank_per_step == pytest.approx(ideal + rs, rel=1e-9)
        assert {(o.op, o.wire_op) for o in volume.per_op} == {
            ("all_gather", "all_gather"),
            ("reduce_scatter", "all_reduce"),
        }


def test_nominal_sizes_are_output_and_input(
    runs: dict[str, Path], analyses: dict[str, Analysis]
) -> None:
    """all_gather S = the gathered output, reduce_scatter S = the full input, per flat group."""
    for strategy, run in runs.items():
        coll = analyses[strategy].collectives.filter(pl.col("rank") == 0)
        sizes = {4 * n for n in _padded_numels(run)}
        assert set(coll.filter(pl.col("op") == "all_gather")["bytes"].to_list()) == sizes, strategy
        assert set(coll.filter(pl.col("op") == "reduce_scatter")["bytes"].to_list()) == sizes, (
            strategy
        )
        per_step = coll.group_by("op").len().sort("op").rows()
        groups = len(_padded_numels(run))
        gathers = 2 * groups if strategy == "zero3" else groups  # ZeRO-3 gathers each unit twice
        assert per_step == [("all_gather", gathers * STEPS), ("reduce_scatter", groups * STEPS)], (
            strategy
        )


# --- the traces --------------------------------------------------------------------------------------


def _events(run: Path, rank: int = 0) -> tuple[list[dict], set]:
    with gzip.open(runfolder.trace_path(run, rank), "rt") as f:
        trace = json.load(f)
    runloop = {
        e["tid"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and "pt_gloo_runloop" in str(e.get("args", {}).get("name"))
    }
    return sorted(
        (e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"]
    ), runloop


def test_zero1_and_zero2_trace_signatures(runs: dict[str, Path]) -> None:
    events, _ = _events(runs["zero1"])
    names = [e["name"] for e in events]
    assert (
        names.count("comm:reduce_scatter:grads") == STEPS
        and names.count("comm:all_gather:params") == STEPS
    )
    events, runloop = _events(runs["zero2"])
    backward = [e for e in events if e["name"] == "backward"]
    reduce = [e for e in events if e["name"] == "gloo:all_reduce"]
    assert reduce and {e["tid"] for e in reduce} <= runloop
    # ZeRO-2 reduces during backward: some bucket's transfer starts while backward still runs
    assert any(b["ts"] < g["ts"] < b["ts"] + b["dur"] for b in backward for g in reduce)
    launches = [e["name"] for e in events if e["name"].startswith("comm:reduce_scatter:bucket")]
    buckets = len(_padded_numels(runs["zero2"]))
    assert launches[:buckets] == [f"comm:reduce_scatter:bucket{i}" for i in range(buckets)]


def _between(
    events: list[dict], tid, start: str, end: str, after: float = 0
) -> tuple[dict, dict, list[str]]:
    """The first ``start`` label after ``after``, the next ``end`` label, and the ops in between."""
    a = next(e for e in events if e["name"] == start and e["ts"] >= after)
    b = next(e for e in events if e["name"] == end and e["ts"] >= a["ts"])
    ops = [
        e["name"]
        for e in events
        if e["tid"] == tid and e.get("cat") == "cpu_op" and a["ts"] + a["dur"] <= e["ts"] < b["ts"]
    ]
    return a, b, ops


UNIT_COMPUTE = ("aten::embedding", "aten::linear", "aten::layer_norm")


def test_prefetch_launches_next_gather_before_this_unit_computes(
    runs: dict[str, Path], zero3_p0: Path
) -> None:
    """The schedule, read from the trace: with --prefetch 1 unit i's forward compute runs between the
    launch of unit i+1's gather and the wait for it; with --prefetch 0 nothing runs there."""
    for run, prefetch in ((runs["zero3"], 1), (zero3_p0, 0)):
        assert runfolder.load_run_json(run)["config"]["strategy_options"]["prefetch"] == prefetch
        for rank in range(N):
            events, _ = _events(run, rank)
            main = next(e["tid"] for e in events if e["name"] == "forward")
            for step in (e for e in events if e["name"] == "forward"):
                for i in range(UNITS - 1):
                    _, _, ops = _between(
                        events,
                        main,
                        f"comm:all_gather:unit{i + 1}:fwd",
                        f"comm:wait:unit{i + 1}:fwd",
                        after=step["ts"],
                    )
                    computed = [op for op in ops if op in UNIT_COMPUTE]
                    # (when the runloop thread starts the transfer depends on the OS scheduler, so
                    # the schedule, not the timing, is what is asserted; the overlap test measures)
                    assert bool(computed) == bool(prefetch), (rank, i, computed)


def test_prefetch_hides_more_all_gather_time(analyses: dict[str, Analysis], zero3_p0: Path) -> None:
    p1, p0 = analyses["zero3"].summary.overlap, analyze(zero3_p0).summary.overlap
    assert p1 is not None and p0 is not None
    for ov in (p1, p0):
        assert ov.allgather_count == N * 2 * UNITS * ov.steps
        assert ov.allgather_s == pytest.approx(ov.allgather_hidden_s + ov.allgather_exposed_s)
    fwd = {
        k: [r for r in ov.per_layer if r.phase == "fwd" and r.op == "all_gather"]
        for k, ov in (("p1", p1), ("p0", p0))
    }
    hidden = {
        k: sum(r.hidden_s for r in rows) / sum(r.duration_s for r in rows)
        for k, rows in fwd.items()
    }
    # without prefetch a forward gather runs while the thread waits for it: nothing to hide under
    assert hidden["p0"] < 0.05, hidden
    assert hidden["p1"] > hidden["p0"], hidden
    assert p1.allgather_hidden_fraction > p0.allgather_hidden_fraction


def test_prefetch_is_a_zero3_option() -> None:
    validate(RunOptions("zero3", prefetch=2))
    for strategy in ("zero1", "zero2"):
        with pytest.raises(TracekitError, match="prefetch"):
            validate(RunOptions(strategy, prefetch=1))
    with pytest.raises(SystemExit):
        parse_args(STRATEGIES["zero1"], ["--prefetch", "1"])
