"""The strategy registry and the one options declaration: what they generate agrees everywhere."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit import theory
from tracekit.strategies import options, registry, schedules
from tracekit.strategies.options import RunOptions

REPO = Path(__file__).resolve().parents[1]


def test_registry_is_torch_free() -> None:
    code = "import sys, tracekit.strategies.registry; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", list(registry.STRATEGIES))
def test_entry_names_what_exists(name: str) -> None:
    s = registry.STRATEGIES[name]
    module = importlib.import_module(s.entry)
    assert callable(module.main)
    if s.layout:  # torch-free, and it answers for the demo's own layouts
        assert all(
            s.layout_problem(run.get("nproc", 2), run.get("nodes", 1)) is None for run in s.demo
        )
    if s.schedule is not None:
        assert s.schedule in schedules.SCHEDULES
    if s.theory is not None:  # the family has a formula, at every precision the strategy runs
        for precision in s.precisions:
            assert theory.model_states_bytes(s.theory, precision, 1000, 4) is not None


def test_a_wrong_entry_is_refused_on_construction() -> None:
    with pytest.raises(ValueError, match="not an optional option"):
        registry.Strategy("x", "x", uses=frozenset({"steps"}))
    with pytest.raises(ValueError, match="demo option 'nprocs' unknown"):
        registry.Strategy("x", "x", demo=registry._demo({"nprocs": 2}))
    with pytest.raises(ValueError, match="precision 'fp8'"):
        registry.Strategy("x", "x", precisions=("fp8",))
    with pytest.raises(ValueError, match="schedule 'zb-h1' unknown"):
        registry.Strategy("x", "x", schedule="zb-h1")
    with pytest.raises(ValueError, match="not a module name"):
        registry.Strategy("x", "instrumented.x")


def _parsed(opts: RunOptions) -> object:
    spec = registry.STRATEGIES[opts.strategy]
    return options.rank_parser(spec, spec.entry).parse_args(
        ["--run-dir", "/tmp/r", *options.rank_args(opts)]
    )


@pytest.mark.parametrize("name, given", registry.demo_runs())
def test_what_the_launcher_passes_the_ranks_parse_back(name: str, given: dict) -> None:
    opts = RunOptions(name, **given, seed=3, precision="fp32")
    args = _parsed(opts)
    for f, how, _ in options.declared("rank"):
        if how.forward:
            want = options.backend_of(opts) if f.name == "backend" else getattr(opts, f.name)
            if f.name == "global_batch" and want is None:
                want = registry.STRATEGIES[name].global_batch
            assert getattr(args, f.name) == want, f.name
    assert options.problem(registry.STRATEGIES[name], args) is None


def test_problems_name_the_option() -> None:
    dp, zero3 = registry.STRATEGIES["dp"], registry.STRATEGIES["zero3"]
    cases = [
        (RunOptions("dp", microbatches=4), "--microbatches is not used by dp"),
        (RunOptions("zero3", prefetch=3), "--prefetch must be 0, 1 or 2"),
        (RunOptions("dp", precision="fp8"), "--precision must be fp32 or bf16-mixed, not 'fp8'"),
        (RunOptions("dp", steps=0), "--steps must be at least 1"),
        (RunOptions("dp", timeout=0.0), "--timeout must be more than 0"),
        (RunOptions("dp", backend="nccl"), "--backend nccl needs --device cuda"),
        (RunOptions("pp-gpipe", precision="bf16-mixed"), "not supported for pp-gpipe"),
    ]
    for opts, words in cases:
        why = options.problem(registry.STRATEGIES[opts.strategy], opts)
        assert why is not None and words in why, (opts, why)
    assert options.problem(dp, RunOptions("dp")) is None
    assert options.problem(zero3, RunOptions("zero3", prefetch=0)) is None


def test_every_run_option_is_on_the_command_line() -> None:
    from click.testing import CliRunner

    from tracekit.cli import cli

    text = CliRunner().invoke(cli, ["run", "--help"], terminal_width=200).output
    for f, _how, _ in options.declared("run"):
        assert options.flag(f.name) in text
    for f in dataclasses.fields(RunOptions):
        how = f.metadata.get("option")
        if how is not None and how.side == "rank":
            assert options.flag(f.name) not in text


def test_name_phrases() -> None:
    assert options.name_phrases({"prefetch": 0, "nodes": 2, "precision": "bf16-mixed"}) == [
        "prefetch 0",
        "2 nodes",
        "bf16-mixed",
    ]
    assert options.name_phrases({"nodes": 1, "precision": "fp32", "microbatches": None}) == []
