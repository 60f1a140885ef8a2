"""Real traces of our own runs on an NVIDIA H200 (torch 2.11+cu130, NCCL 2.28.9), made by
scripts/gpu_check.sh on the GPU machine this project is sometimes lent (one GPU): a one-rank NCCL
run (NCCL launches no collective kernels with one rank), a two-rank gloo run whose ranks share
the GPU (gloo moves CUDA tensors through host memory), and a tracekit.profile job."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_reference import differences, rank_seconds

from tracekit.analysis import analyze

GPU = Path(__file__).resolve().parent / "data" / "gpu"


def _traces(run: Path) -> list[Path]:
    return sorted((run / "traces").glob("rank*.json.gz"))


def test_cuda_dp_run_breakdown_memory_and_nccl_log():
    result = analyze(GPU / "dp-cuda-nccl")
    (info,) = result.infos
    assert info.has_gpu and info.backend == "nccl"
    # --steps 2: on GPU the last, cut-short step is dropped as HTA does
    assert (result.summary.window.kind, result.summary.window.steps) == ("complete_steps", 1)
    (rank,) = result.summary.ranks
    assert rank.compute_s > 0 and rank.comm_s == 0
    # every number against the kernels and copies launched before the last step, from the JSON
    assert differences([rank], rank_seconds(_traces(GPU / "dp-cuda-nccl"))) == []
    # a 0.9M-parameter model cannot keep an H200 busy: the GPU idles most of the step
    assert rank.idle_s > rank.compute_s
    (mem,) = result.summary.memory.per_rank
    assert mem.peak_device == "cuda:0" and mem.peak_bytes > mem.model_states_bytes
    assert mem.ratio_to_theory == pytest.approx(1.0, abs=1e-3)
    assert result.summary.nccl.logs.version.startswith("2.28")


def test_cuda_job_captured_with_tracekit_profile():
    (run,) = [p for p in GPU.iterdir() if p.name == "user-cuda"]
    result = analyze(run)
    assert result.summary.window.kind == "complete_steps"
    assert result.summary.window.steps == 2  # active=3, the last one cut short
    (rank,) = result.summary.ranks
    assert rank.compute_s > 0
    kernels = result.events.filter(
        (result.events["device"] == "gpu") & (result.events["kind"] == "compute")
    )
    assert kernels.height > 0


def test_gloo_ranks_sharing_a_gpu_count_gloo_spans_as_communication():
    """dp, 2 ranks, gloo on CUDA tensors: no communication kernels, so the gloo spans on the
    host are each GPU rank's communication; without them the GPU would look idle instead."""
    result = analyze(GPU / "dp-cuda-gloo")
    assert [(i.rank, i.has_gpu, i.backend) for i in result.infos] == [
        (0, True, "gloo"),
        (1, True, "gloo"),
    ]
    events = result.events
    assert (
        events.filter((events["device"] == "gpu") & (events["kind"] == "communication")).height == 0
    )
    gloo = events.filter(events["name"].str.starts_with("gloo:all_reduce"))
    assert gloo.height > 0
    # every number against the device events and the host's gloo spans, from the JSON
    ref = rank_seconds(_traces(GPU / "dp-cuda-gloo"))
    assert differences(result.summary.ranks, ref) == []
    for rank in result.summary.ranks:
        assert rank.compute_s > 0 and rank.comm_s > 0
        # comm is the union of this rank's gloo spans inside the window: never more than their sum
        mine = gloo.filter(
            (gloo["rank"] == rank.rank)
            & (gloo["end_ns"] > rank.window_start_ns)
            & (gloo["start_ns"] < rank.window_end_ns)
        )
        assert rank.comm_s <= (mine["end_ns"] - mine["start_ns"]).sum() * 1e-9 + 1e-9
    (all_reduce,) = [op for op in result.summary.collectives.per_op if op.op == "all_reduce"]
    assert all_reduce.unknown_size == 0 and all_reduce.bytes > 0
