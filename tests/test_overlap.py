"""All-gather / reduce-scatter overlap: on our ZeRO-3 sample, on a real FSDP2 trace (fully_shard on
CPU gloo, 2 ranks, generated here), and the interval arithmetic on frames built by hand."""

from __future__ import annotations

import textwrap
from pathlib import Path

import polars as pl
import pytest
from conftest import SAMPLES, torchrun

from tracekit.analyses.overlap import compute_intervals, overlap_summary, overlap_units
from tracekit.analysis import Analysis, analyze
from tracekit.summary.memory import Overlap

FSDP2_JOB = textwrap.dedent('''
    """2-rank FSDP2 job: fully_shard per block and on the root, 2 profiled steps into OUT/traces/."""
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from instrumented_runs.model import GPT, GPTConfig, make_optimizer
    from tracekit import capture

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = GPT(GPTConfig(), seed=0)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = make_optimizer(model.parameters())
    tokens = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(dist.get_rank()))

    def step():
        model(tokens, tokens).backward()
        opt.step()
        opt.zero_grad()

    step()
    with capture.profile_steps(sys.argv[1], dist.get_rank(), steps=2) as prof:
        for _ in range(2):
            step()
            prof.step()
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def fsdp2_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp2")
    script = out / "job.py"
    script.write_text(FSDP2_JOB)
    torchrun(script, out / "run")
    return out / "run"


@pytest.fixture(scope="module")
def fsdp2(fsdp2_traces: Path) -> Analysis:
    return analyze(fsdp2_traces)


@pytest.mark.slow
def test_fsdp2_labels_attribute_every_collective(fsdp2: Analysis) -> None:
    result = fsdp2
    frame = result.frames["overlap_units"]
    assert frame.height > 0 and frame.filter(pl.col("unit") == "unlabelled").height == 0
    blocks = [f"blocks.{i}" for i in range(4)]
    got = set(frame.select("unit", "phase", "op").unique().rows())
    # FSDP2: every block gathered before its forward and (resharded after forward) before its
    # backward, its gradients reduce-scattered; the root's parameters stay gathered after forward
    for b in blocks:
        assert {
            (b, "fwd", "all_gather"),
            (b, "bwd", "all_gather"),
            (b, "bwd", "reduce_scatter"),
        } <= got
    assert {("root", "fwd", "all_gather"), ("root", "bwd", "reduce_scatter")} <= got
    ov = result.summary.overlap
    steps, ranks = ov.steps, ov.ranks
    assert (steps, ranks) == (2, 2)
    assert ov.allgather_count == ranks * steps * (2 * len(blocks) + 1)
    assert ov.reducescatter_count == ranks * steps * (len(blocks) + 1)
    rows = {(r.unit, r.phase, r.op): r for r in ov.per_layer}
    assert all(r.count == ranks * steps for r in rows.values())
    # per_layer in order of first appearance: the forward gathers in module order come first
    assert [r.unit for r in ov.per_layer[:5]] == ["root", *blocks]
    # the gathered unit sizes are what FSDP2 gathers: a block's parameters (padded) in fp32
    coll = result.collectives.filter(pl.col("op") == "all_gather")
    assert coll["bytes"].min() > 0


def _check_frame_identities(frame: pl.DataFrame, ov: Overlap | None) -> None:
    assert ov is not None
    assert (frame["hidden_s"] >= 0).all() and (frame["exposed_s"] >= -1e-12).all()
    assert (frame["hidden_s"] + frame["exposed_s"] - frame["duration_s"]).abs().max() < 1e-12
    assert (frame["duration_s"] - (frame["end_ns"] - frame["start_ns"]) * 1e-9).abs().max() < 1e-12
    n = frame["rank"].n_unique()
    ag = frame.filter(pl.col("op") == "all_gather")
    assert ov.allgather_s == pytest.approx(ag["duration_s"].sum() / n)
    assert ov.allgather_hidden_fraction == pytest.approx(
        ag["hidden_s"].sum() / ag["duration_s"].sum()
    )
    assert sum(r.count for r in ov.per_layer) == frame.height


@pytest.mark.slow
def test_fsdp2_frame_identities(fsdp2: Analysis) -> None:
    _check_frame_identities(fsdp2.frames["overlap_units"], fsdp2.summary.overlap)


def test_zero3_sample_per_unit_table() -> None:
    result = analyze(SAMPLES / "zero3")
    ov, frame = result.summary.overlap, result.frames["overlap_units"]
    _check_frame_identities(frame, ov)
    units = [f"unit{i}" for i in range(6)]
    keys = [(r.unit, r.phase, r.op) for r in ov.per_layer]
    assert keys[:6] == [(u, "fwd", "all_gather") for u in units]
    assert set(keys[6:]) == {
        (u, "bwd", op) for u in units for op in ("all_gather", "reduce_scatter")
    }
    ranks, steps = ov.ranks, ov.steps
    assert all(r.count == ranks * steps for r in ov.per_layer)
    # the first unit's forward gather has nothing before it to hide under
    assert ov.per_layer[0].hidden_s == pytest.approx(0.0, abs=1e-4)
    assert set(frame.columns) >= {
        "rank",
        "unit",
        "phase",
        "op",
        "start_ns",
        "end_ns",
        "duration_s",
        "hidden_s",
        "exposed_s",
    }


def test_no_gathers_no_section() -> None:
    assert analyze(SAMPLES / "dp").summary.overlap is None


# --- the arithmetic on frames built by hand -----------------------------------------------------


def _segments(rows: list[tuple[int, int, int, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "state": pl.Utf8},
        orient="row",
    )


def _events(rows: list[tuple]) -> pl.DataFrame:
    schema = {
        "rank": pl.Int32,
        "device": pl.Utf8,
        "pid": pl.Utf8,
        "tid": pl.Utf8,
        "cat": pl.Utf8,
        "name": pl.Utf8,
        "start_ns": pl.Int64,
        "end_ns": pl.Int64,
        "kind": pl.Utf8,
        "correlation": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def _coll(rows: list[tuple]) -> pl.DataFrame:
    schema = {
        "rank": pl.Int32,
        "op": pl.Utf8,
        "bytes": pl.Int64,
        "start_ns": pl.Int64,
        "end_ns": pl.Int64,
        "call_start_ns": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def test_hidden_is_the_intersection_with_compute_minus_waits() -> None:
    # compute [0,100) and [150,300); overlap [300,350) counts as compute; idle between
    seg = _segments(
        [
            (0, 0, 100, "compute"),
            (0, 100, 150, "idle"),
            (0, 150, 300, "compute"),
            (0, 300, 350, "overlap"),
            (0, 350, 400, "comm"),
        ]
    )
    ev = _events(
        [
            # labels and calls on the main thread: a forward gather of unit1 launched at 10 ...
            (0, "cpu", "1", "1", "user_annotation", "forward", 0, 200, "annotation", None),
            (
                0,
                "cpu",
                "1",
                "1",
                "user_annotation",
                "comm:all_gather:unit1:fwd",
                10,
                20,
                "annotation",
                None,
            ),
            (0, "cpu", "1", "1", "cpu_op", "c10d::_allgather_base_", 12, 18, "communication", None),
            # ... and a reduce-scatter inside an FSDP2 post-backward of blocks.0, launched at 250
            (0, "cpu", "1", "1", "user_annotation", "backward", 200, 400, "annotation", None),
            (
                0,
                "cpu",
                "1",
                "1",
                "user_annotation",
                "FSDP::post_backward_reduce (blocks.0)",
                240,
                260,
                "annotation",
                None,
            ),
            (
                0,
                "cpu",
                "1",
                "1",
                "cpu_op",
                "c10d::_reduce_scatter_base_",
                250,
                255,
                "communication",
                None,
            ),
            # the main thread waits inside an autograd op from 160 to 200: not compute
            (
                0,
                "cpu",
                "1",
                "1",
                "user_annotation",
                "comm:wait:unit1:bwd",
                160,
                200,
                "annotation",
                None,
            ),
        ]
    )
    coll = _coll([(0, "all_gather", 64, 50, 180, 12), (0, "reduce_scatter", 64, 260, 380, 250)])
    frame = overlap_units(ev, coll, seg)
    ag, rs = frame.row(0, named=True), frame.row(1, named=True)
    assert (ag["unit"], ag["phase"], ag["label"]) == ("unit1", "fwd", "comm:all_gather:unit1:fwd")
    # [50,180) ∩ compute = [50,100) + [150,160) (the wait [160,200) is taken out) = 60 ns
    assert ag["hidden_s"] == pytest.approx(60e-9) and ag["exposed_s"] == pytest.approx(70e-9)
    assert (rs["unit"], rs["phase"]) == ("blocks.0", "bwd")
    # [260,380) ∩ compute = [260,350) = 90 ns
    assert rs["hidden_s"] == pytest.approx(90e-9) and rs["exposed_s"] == pytest.approx(30e-9)
    summary = overlap_summary(frame, n_ranks=1, steps=1)
    assert summary.allgather_hidden_fraction == pytest.approx(60 / 130)
    assert summary.reducescatter_hidden_fraction == pytest.approx(90 / 120)
    # on a GPU rank the CPU waits do not touch the (GPU) compute segments
    assert compute_intervals(seg, ev, gpu_ranks={0})["end_ns"].to_list() == [100, 300, 350]


def test_unlabelled_and_root_units() -> None:
    seg = _segments([(0, 0, 100, "compute")])
    ev = _events(
        [
            (0, "cpu", "1", "1", "user_annotation", "FSDP::pre_forward", 0, 40, "annotation", None),
            (0, "cpu", "1", "1", "user_annotation", "FSDP::all_gather", 5, 30, "annotation", None),
            (0, "cpu", "1", "1", "cpu_op", "c10d::_allgather_base_", 10, 20, "communication", None),
            (0, "cpu", "1", "1", "cpu_op", "c10d::_allgather_base_", 60, 70, "communication", None),
        ]
    )
    coll = _coll([(0, "all_gather", 8, 20, 50, 10), (0, "all_gather", 8, 70, 90, 60)])
    frame = overlap_units(ev, coll, seg)
    assert frame.select("unit", "phase").rows() == [("root", "fwd"), ("unlabelled", "step")]


def test_volume_ideal_and_wire_per_rank_per_step() -> None:
    """``volume``: S x bus factor of the op asked for (ideal) and of the op gloo ran (wire)."""
    from tracekit.analyses.volume import volume_summary

    schema = {
        "rank": pl.Int32,
        "op": pl.Utf8,
        "bytes": pl.Int64,
        "wire_op": pl.Utf8,
        "wire_bytes": pl.Int64,
        "group_size": pl.Int32,
    }
    rows = []
    for rank in (0, 1):
        rows += [
            (rank, "all_gather", 400, "all_gather", None),  # sizes unknown on the span: S
            (rank, "reduce_scatter", 400, "all_reduce", 400),  # gloo: a full all-reduce
            (rank, "all_reduce", 100, "all_reduce", 100),
        ]
    coll = pl.DataFrame([(*r, 4) for r in rows], schema=schema, orient="row")
    v = volume_summary(coll, steps=2)
    # ideal: (400 x 3/4 + 400 x 3/4 + 100 x 6/4) / 2 steps; wire: the reduce-scatter at 6/4
    assert v.ideal_bytes_per_rank_per_step == pytest.approx((300 + 300 + 150) / 2)
    assert v.wire_bytes_per_rank_per_step == pytest.approx((300 + 600 + 150) / 2)
    assert v.wire_to_ideal == pytest.approx(1050 / 750)
    ops = {(o.op, o.wire_op): o for o in v.per_op}
    assert ops[("reduce_scatter", "all_reduce")].calls_per_step == 0.5
    assert volume_summary(coll.clear(), steps=2) is None and volume_summary(coll, steps=0) is None
