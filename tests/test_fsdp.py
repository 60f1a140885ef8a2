"""FSDP2 (fsdp) and HSDP (hsdp), end to end: real gloo jobs checked against single-process training.

Three runs, each reused by many assertions: fsdp fp32 on 2 ranks (prefetch 1, the default),
fsdp bf16-mixed on 2 ranks with --prefetch 0, and hsdp fp32 on 2 nodes x 2 ranks.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli
from corpus_reference import differences, rank_seconds

from instrumented_runs.model import GPTConfig
from instrumented_runs.single import train_single
from tracekit import capture, runfolder
from tracekit.capture.launch import RunOptions, run_job
from tracekit.strategies.layouts import hsdp_mesh as check_layout

pytestmark = pytest.mark.slow

STEPS, WARMUP = 3, 1
PSI = GPTConfig().n_params()


def _run(tmp_path_factory: pytest.TempPathFactory, **options) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEKIT_SAVE_PARAMS", "1")
        run = run_job(RunOptions(out=tmp_path_factory.mktemp("runs"), warmup=WARMUP, **options))
    data = runfolder.load_run_json(run)
    assert data is not None and data["status"] == "ok", data
    return run


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory, strategy="fsdp", nproc=2, steps=STEPS)


@pytest.fixture(scope="module")
def fsdp_bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(
        tmp_path_factory, strategy="fsdp", nproc=2, steps=2, precision="bf16-mixed", prefetch=0
    )


@pytest.fixture(scope="module")
def hsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory, strategy="hsdp", nproc=4, nodes=2, steps=STEPS)


def _losses(run: Path, rank: int) -> list[float]:
    return json.loads(runfolder.train_path(run, rank).read_text())["losses"]


def _mean_losses(run: Path, world: int) -> list[float]:
    return [sum(step) / world for step in zip(*(_losses(run, r) for r in range(world)))]


def _memory(run: Path, rank: int) -> dict:
    return json.loads(runfolder.memory_path(run, rank).read_text())


def _events(run: Path, rank: int) -> list[dict]:
    with gzip.open(runfolder.trace_path(run, rank), "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _strategy_options(run: Path) -> dict:
    return runfolder.load_run_json(run)["config"]["strategy_options"]


def _full_params(run: Path, ranks: list[int]) -> dict[str, torch.Tensor]:
    """The full parameters: the dim-0 shards of ``ranks`` (one shard group) concatenated."""
    shards = [capture.load_params(run, r) for r in ranks]
    return {name: torch.cat([s[name] for s in shards]) for name in shards[0]}


# --- equivalence with single-process training ---------------------------------------------------


def test_fsdp_losses_match_single_process(fsdp_run: Path) -> None:
    ref, _ = train_single(WARMUP + STEPS)
    got = _mean_losses(fsdp_run, 2)
    assert len(got) == len(ref) == WARMUP + STEPS
    for g, r in zip(got, ref):
        assert abs(g - r) <= 1e-5 * abs(r)  # docs/strategies.md: fp32 within 1e-5 relative


def test_hsdp_losses_match_single_process(hsdp_run: Path) -> None:
    ref, _ = train_single(WARMUP + STEPS)
    got = _mean_losses(hsdp_run, 4)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert abs(g - r) <= 1e-5 * abs(r)


def test_fsdp_parameters_match_single_process(fsdp_run: Path) -> None:
    # The shards of ranks 0 and 1 put together are the model; 2-rank gradient averaging is the
    # same arithmetic as accumulating two half batches, so the comparison is tight.
    _, ref = train_single(WARMUP + STEPS, accumulate=2)
    full = _full_params(fsdp_run, [0, 1])
    assert full.keys() == ref.keys()
    for name, want in ref.items():
        torch.testing.assert_close(full[name], want, rtol=1e-5, atol=1e-7, msg=name)


def test_hsdp_replicas_identical_and_match_single_process(hsdp_run: Path) -> None:
    p = {r: capture.load_params(hsdp_run, r) for r in range(4)}
    for name in p[0]:  # replicate groups {0,2}, {1,3}: same shard
        assert torch.equal(p[0][name], p[2][name]) and torch.equal(p[1][name], p[3][name]), name
    # ((g0+g1)/2 + (g2+g3)/2)/2 rounds differently from (g0+..+g3)/4: compare trajectories
    # (the gap next to the distance training moved), as test_dp does against full-batch training.
    full = _full_params(hsdp_run, [0, 1])
    _, ref = train_single(WARMUP + STEPS, accumulate=4)
    _, init = train_single(0)
    for name, want in ref.items():
        moved = (want - init[name]).norm()
        assert (full[name] - want).norm() <= 1e-3 * moved + 1e-12, name


def test_bf16_mixed_matches_and_keeps_fp32_master_shards(fsdp_bf16_run: Path) -> None:
    ref, _ = train_single(WARMUP + 2, precision="bf16-mixed")
    for g, r in zip(_mean_losses(fsdp_bf16_run, 2), ref):
        assert abs(g - r) <= 1e-2 * abs(r)  # docs/strategies.md: bf16-mixed within 1e-2
    params = capture.load_params(fsdp_bf16_run, 0)
    assert {t.dtype for t in params.values()} == {
        torch.float32
    }  # the sharded params are the master
    data = runfolder.load_run_json(fsdp_bf16_run)
    assert data["precision"] == "bf16-mixed"
    assert data["config"]["strategy_options"]["mixed_precision"] == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "bfloat16",
    }
    for rank in (0, 1):
        names = {e["name"] for e in _events(fsdp_bf16_run, rank)}
        assert not any(n.startswith("FSDP::forward_prefetch") for n in names)  # --prefetch 0
        ags = [e for e in _events(fsdp_bf16_run, rank) if e["name"] == "c10d::_allgather_base_"]
        assert ags and all(
            e["args"]["Input type"][0] == "c10::BFloat16" for e in ags
        )  # bf16 on the wire


# --- memory: 16 Psi / (shard group size), counted from the tensors ---------------------------------


def _check_sharded_memory(run: Path, ranks: range, shard: int, precision: str) -> None:
    n_tensors = len(capture.load_params(run, 0))
    for rank in ranks:
        mem = _memory(run, rank)
        assert mem["step"] == 1
        steps = mem["optimizer_bytes_by_key"]["step"]  # Adam's scalar step counters
        assert 0 < steps <= 8 * n_tensors
        assert (
            mem["model_states_bytes"]
            == mem["params_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]
        )
        assert mem["model_states_bytes"] - steps == pytest.approx(16 * PSI / shard, rel=0.02)
        assert mem["grads_bytes"] == pytest.approx(
            4 * PSI / shard, rel=0.02
        )  # fp32 gradient shards
        if precision == "fp32":
            assert mem["params_bytes"] == pytest.approx(4 * PSI / shard, rel=0.02)
            assert mem["optimizer_bytes"] - steps == pytest.approx(8 * PSI / shard, rel=0.02)
        else:  # K=12: 4 master (the fp32 shard) + 8 moments, no bf16 parameter copy at rest
            assert mem["params_bytes"] == 0
            assert mem["optimizer_bytes_by_key"]["master"] == pytest.approx(
                4 * PSI / shard, rel=0.02
            )
            assert mem["optimizer_bytes"] - steps == pytest.approx(12 * PSI / shard, rel=0.02)
        assert mem["activation_peak_bytes"] > 0


def test_fsdp_memory_is_16_psi_over_n(fsdp_run: Path) -> None:
    _check_sharded_memory(fsdp_run, range(2), 2, "fp32")


def test_fsdp_bf16_memory_is_16_psi_over_n(fsdp_bf16_run: Path) -> None:
    _check_sharded_memory(fsdp_bf16_run, range(2), 2, "bf16-mixed")


def test_hsdp_memory_is_16_psi_over_shard_size(hsdp_run: Path, fsdp_run: Path) -> None:
    _check_sharded_memory(hsdp_run, range(4), 2, "fp32")
    # activations: hsdp ranks see 8/4 sequences, fsdp ranks 8/2 and the same per-sequence graph
    hsdp_act = _memory(hsdp_run, 0)["activation_peak_bytes"]
    assert _memory(fsdp_run, 0)["activation_peak_bytes"] == pytest.approx(2 * hsdp_act, rel=0.1)


# --- traces: FSDP2's own labels -------------------------------------------------------------------


def test_fsdp_trace_has_fsdp2_labels(fsdp_run: Path) -> None:
    units = _strategy_options(fsdp_run)["units"]
    assert [u["fqn"] for u in units] == [f"blocks.{i}" for i in range(GPTConfig().n_layers)] + [""]
    assert sum(u["numel"] for u in units) == PSI
    for rank in (0, 1):
        events = _events(fsdp_run, rank)
        names = {e["name"] for e in events}
        assert {f"ProfilerStep#{i}" for i in range(STEPS)} <= names
        assert {"step", "forward", "backward", "optimizer", "zero_grad"} <= names
        for u in units:
            assert u["label"] in names  # FSDP::all_gather (blocks.i)
            suffix = f" ({u['fqn']})" if u["fqn"] else ""
            assert f"FSDP::post_backward_reduce{suffix}" in names  # holds the reduce-scatter
            assert f"FSDP::pre_forward{suffix}" in names
        assert (
            "FSDP::forward_prefetch for blocks.1" in names
            and "FSDP::backward_prefetch for blocks.2" in names
        )
        # blocks are gathered twice per step (forward, backward), the root once (kept for backward)
        count = {u["label"]: sum(e["name"] == u["label"] for e in events) for u in units}
        assert count == {u["label"]: (2 if u["fqn"] else 1) * STEPS for u in units}
        # the collectives inside the labels, and their gloo transfers on a runloop thread
        assert sum(e["name"] == "c10d::_allgather_base_" for e in events) == sum(count.values())
        assert sum(e["name"] == "c10d::_reduce_scatter_base_" for e in events) == len(units) * STEPS
        assert {"gloo:all_gather", "gloo:all_reduce"} <= names  # gloo: reduce-scatter = all-reduce


def test_hsdp_trace_reduces_in_both_groups(hsdp_run: Path) -> None:
    for rank in range(4):
        events = _events(hsdp_run, rank)
        names = [e["name"] for e in events]
        assert names.count("FSDP::all_gather (blocks.0)") == 2 * STEPS
        # per unit and step: reduce-scatter in the shard group, then all-reduce in the replicate group
        assert (
            names.count("c10d::_reduce_scatter_base_")
            == names.count("c10d::allreduce_")
            == 5 * STEPS
        )


# --- process groups: run.json, trace, flight recorder --------------------------------------------


def test_hsdp_process_groups(hsdp_run: Path) -> None:
    data = runfolder.load_run_json(hsdp_run)
    assert [(t["rank"], t["node"]) for t in data["topology"]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    options = data["config"]["strategy_options"]
    assert (options["shard_size"], options["replicate_size"]) == (2, 2)
    groups = options["process_groups"]
    assert sorted((g["dim"], tuple(g["ranks"])) for g in groups) == [
        ("replicate", (0, 2)),
        ("replicate", (1, 3)),
        ("shard", (0, 1)),
        ("shard", (2, 3)),
    ]
    node = {t["rank"]: t["node"] for t in data["topology"]}
    for g in groups:  # shard groups inside a node, replicate groups across nodes
        assert len({node[r] for r in g["ranks"]}) == (1 if g["dim"] == "shard" else 2)
    by_name = {g["name"]: g for g in groups}
    assert len(by_name) == 4
    for rank in range(4):
        mine = {g["name"] for g in groups if rank in g["ranks"]}
        # the trace's distributedInfo names the same groups with the same ranks
        with gzip.open(runfolder.trace_path(hsdp_run, rank), "rt") as f:
            pg_config = json.load(f)["distributedInfo"]["pg_config"]
        traced = {pg["pg_name"]: pg["ranks"] for pg in pg_config}
        assert all(traced[name] == by_name[name]["ranks"] for name in mine)
        # the flight-recorder dump holds this rank's collectives in both of its groups, by name
        fr = json.loads(capture.flight_recorder_path(hsdp_run, rank).read_text())
        recorded = {e["process_group"][0]: e["process_group"][1] for e in fr["entries"]}
        assert mine <= recorded.keys()
        assert {recorded[name] for name in mine} == {"mesh_shard", "mesh_replicate"}
        ops = {(e["process_group"][0], e["profiling_name"]) for e in fr["entries"]}
        shard = next(g["name"] for g in groups if rank in g["ranks"] and g["dim"] == "shard")
        replicate = next(
            g["name"] for g in groups if rank in g["ranks"] and g["dim"] == "replicate"
        )
        assert (shard, "gloo:all_gather") in ops and (replicate, "gloo:all_reduce") in ops
        assert (
            replicate,
            "gloo:all_gather",
        ) not in ops  # parameters are gathered inside the node only


def test_fsdp_process_group_is_the_world(fsdp_run: Path) -> None:
    (group,) = _strategy_options(fsdp_run)["process_groups"]
    assert group["dim"] == "shard" and group["ranks"] == [0, 1]


# --- analysis and CLI -----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["fsdp_run", "hsdp_run"])
def test_analyze_succeeds(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    run = request.getfixturevalue(which)
    world = 2 if which == "fsdp_run" else 4
    proc = run_cli("analyze", str(run), "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == list(range(world))
    for r in summary["ranks"]:
        assert r["comm_s"] > 0 and r["compute_s"] > 0
    # every number of the breakdown against the same computed from the trace JSON
    ref = rank_seconds(sorted((run / "traces").glob("rank*.json.gz")))
    assert differences(summary["ranks"], ref) == []
    ops = {op["op"] for op in summary["collectives"]["per_op"]}
    assert {"all_gather", "reduce_scatter"} <= ops
    assert summary["memory"] is not None and len(summary["memory"]["per_rank"]) == world
    for table in ("ranks", "collectives"):
        assert (tmp_path / "a" / f"{table}.parquet").is_file()
    assert len(list((tmp_path / "a" / "timeline").glob("rank*.parquet"))) == world


def test_hsdp_layout_rules() -> None:
    assert check_layout(4, 2) is None and check_layout(8, 2) is None
    assert "--nodes" in check_layout(4, 1)
    assert "2 ranks per node" in check_layout(2, 2)
    proc = subprocess.run(
        [sys.executable, "-m", "instrumented_runs.hsdp", "--nodes", "1", "--out", "/nonexistent"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "hsdp needs --nodes K >= 2" in proc.stderr


def test_prefetch_is_validated() -> None:
    proc = run_cli("run", "fsdp", "--prefetch", "3", "--out", "/nonexistent")
    assert proc.returncode == 2
