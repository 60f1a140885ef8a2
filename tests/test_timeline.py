"""The interval algebra on hand-built traces whose every number is known in advance.

The same two ranks go in as events (the timeline's functions) and as Kineto JSON files
(``tracekit.analyze``, ingest included); every ranks[] number must be the one worked out by hand
from the intervals (``KNOWN``), and so must the plain-Python reference's
(tests/corpus_reference.py) that the tests on real traces compare with.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from builders.analyses import event_frame
from builders.traces import complete, kineto, thread_name, write_trace
from corpus_reference import differences, rank_seconds

from tracekit import gloo_threads, timeline
from tracekit.analyses import breakdown
from tracekit.analysis import analyze


def ev(
    rank,
    name,
    start,
    end,
    *,
    cat="cpu_op",
    kind="compute",
    tid="1",
    device="cpu",
    thread_name=None,
    correlation=None,
    op=None,
):
    return dict(
        rank=rank,
        name=name,
        start_ns=start,
        end_ns=end,
        cat=cat,
        kind=kind,
        tid=tid,
        pid="100",
        device=device,
        thread_name=thread_name,
        correlation=correlation,
        op=op,
        stream=int(tid) if device == "gpu" else None,
    )


CPU_RANK = [
    ev(0, "ProfilerStep#1", 0, 100, cat="user_annotation", kind="annotation"),
    ev(0, "ProfilerStep#2", 100, 200, cat="user_annotation", kind="annotation"),
    ev(0, "aten::linear", 10, 40),
    ev(0, "aten::addmm", 20, 30),  # nested: counted once
    ev(0, "aten::mm", 50, 60),
    ev(0, "c10d::allreduce_", 60, 65, kind="communication", op="all_reduce"),
    ev(0, "aten::add_", 110, 150),
    ev(
        0,
        "gloo:all_reduce",
        30,
        80,
        cat="user_annotation",
        kind="communication",
        tid="2",
        thread_name="thread 2 (pt_gloo_runloop)",
        op="all_reduce",
    ),
    ev(
        0, "aten::copy_", 35, 45, tid="2", thread_name="thread 2 (pt_gloo_runloop)"
    ),  # runloop op: not compute
    ev(0, "gloo:send", 160, 190, cat="user_annotation", kind="communication", op="send"),
    ev(0, "aten::view", 170, 175),  # runs while an isend is in flight: compute
]

GPU_RANK = [
    ev(1, "ProfilerStep#1", 0, 1000, cat="user_annotation", kind="annotation"),
    ev(1, "ProfilerStep#2", 1000, 2000, cat="user_annotation", kind="annotation"),
    ev(1, "ProfilerStep#3", 2000, 2500, cat="user_annotation", kind="annotation"),  # cut short
    ev(1, "cudaLaunchKernel", 50, 55, cat="cuda_runtime", kind="runtime", correlation=1),
    ev(1, "cudaLaunchKernel", 60, 65, cat="cuda_runtime", kind="runtime", correlation=2),
    ev(1, "cudaMemcpyAsync", 500, 505, cat="cuda_runtime", kind="runtime", correlation=3),
    ev(1, "cudaLaunchKernel", 2050, 2055, cat="cuda_runtime", kind="runtime", correlation=4),
    ev(1, "cudaLaunchKernel", 1400, 1405, cat="cuda_runtime", kind="runtime", correlation=5),
    ev(1, "gemm", 100, 300, cat="kernel", device="gpu", tid="7", correlation=1),
    ev(
        1,
        "ncclKernel_AllReduce_RING_LL",
        200,
        500,
        cat="kernel",
        kind="communication",
        device="gpu",
        tid="8",
        correlation=2,
        op="all_reduce",
    ),
    ev(
        1,
        "Memcpy DtoD",
        600,
        700,
        cat="gpu_memcpy",
        kind="memory",
        device="gpu",
        tid="7",
        correlation=3,
    ),
    ev(
        1, "gemm", 2100, 2300, cat="kernel", device="gpu", tid="7", correlation=4
    ),  # launched in last step
    ev(1, "relu", 1500, 1600, cat="kernel", device="gpu", tid="7", correlation=5),
]


# Every ranks[] number of CPU_RANK (rank 0) and GPU_RANK (rank 1) in ns, from the intervals by hand.
KNOWN = {
    # window [0,200], the two steps. compute: [10,40] [50,60] [110,150] [170,175] = 85 (the view
    # runs inside the gloo:send, whose peer is unknown: an op nested in it is compute; the
    # runloop's copy_ is not); comm: [30,80] (holding the c10d call [60,65]) [160,190] = 80;
    # overlap: [30,40] [50,60] [170,175] = 25; idle: [0,10] [80,110] [150,160] [190,200] = 60
    0: {"span": 200, "compute": 85, "comm": 80, "overlap": 25, "exposed_comm": 55, "other": 0,
        "idle": 60},
    # window [100,1600]: the kernels launched before the last step starts (not correlation 4).
    # compute: [100,300] [1500,1600] = 300; comm: [200,500] = 300; overlap: [200,300] = 100;
    # other: the memcpy [600,700] = 100; idle: [500,600] [700,1500] = 900
    1: {"span": 1500, "compute": 300, "comm": 300, "overlap": 100, "exposed_comm": 200,
        "other": 100, "idle": 900},
}  # fmt: skip


def known_ranks() -> list[dict]:
    """KNOWN as the summary's ranks[] rows (seconds)."""
    return [
        {"rank": r, **{f"{k}_s": ns * 1e-9 for k, ns in known.items()}}
        for r, known in KNOWN.items()
    ]


def as_kineto(rows: list[dict]) -> list[dict]:
    """The event rows as torch.profiler writes them: device events on pid 0 with a stream per
    tid, host events on pid 100, named threads with their metadata event."""
    events, named = [], set()
    for r in rows:
        gpu = r["device"] == "gpu"
        pid, tid = (0 if gpu else 100), int(r["tid"])
        args = {} if r["correlation"] is None else {"correlation": r["correlation"]}
        if gpu:
            args["stream"] = tid
        events.append(
            complete(r["name"], r["cat"], r["start_ns"], r["end_ns"], pid=pid, tid=tid, **args)
        )
        if r["thread_name"] and (pid, tid) not in named:
            named.add((pid, tid))
            events.append(thread_name(pid, tid, r["thread_name"]))
    return events


@pytest.fixture
def hand_built(tmp_path: Path) -> list[Path]:
    """The two ranks as the Kineto files of a 2-rank job."""
    return [
        write_trace(tmp_path / "job" / f"rank{rank}.json.gz", kineto(as_kineto(rows), rank, 2))
        for rank, rows in ((0, CPU_RANK), (1, GPU_RANK))
    ]


def run_pipeline(rows, gpu_ranks):
    events = event_frame(rows)
    windows = timeline.analysis_windows(events, gpu_ranks)
    iv = timeline.intervals(events, windows, gpu_ranks)
    windows = timeline.refine_gpu_windows(windows, iv, gpu_ranks)
    seg = timeline.segments(iv, windows)
    return events, windows, seg


def test_cpu_rank_every_number_exact():
    events, windows, seg = run_pipeline(CPU_RANK, set())
    w = windows.row(0, named=True)
    assert (w["kind"], w["steps"], w["start_ns"], w["end_ns"]) == ("complete_steps", 2, 0, 200)
    totals = breakdown.state_totals(seg).row(0, named=True)
    # compute [10,40]+[50,60]+[110,150]+[170,175] = 85; of it [30,40],[50,60],[170,175] under comm
    assert totals["overlap"] == 25
    assert totals["compute"] == 60
    # comm [30,80] u [60,65] u [160,190] = 80, exposed = 55
    assert totals["comm"] == 55
    assert totals["other"] == 0
    assert totals["idle"] == 60  # [0,10] [80,110] [150,160] [190,200]
    table = breakdown.rank_breakdown(seg, windows, timeline.step_markers(events), {0: 0}).row(
        0, named=True
    )
    assert table["span_s"] == pytest.approx(200e-9)
    assert table["compute_s"] == pytest.approx(85e-9)
    assert table["comm_s"] == pytest.approx(80e-9)
    assert table["overlap_s"] == pytest.approx(25e-9)
    assert table["exposed_comm_s"] == pytest.approx(55e-9)
    assert table["idle_s"] == pytest.approx(60e-9)
    assert table["step_time_s"] == pytest.approx(100e-9)


def test_runloop_thread_found_by_name_and_by_content():
    events = event_frame(CPU_RANK)
    loops = gloo_threads.runloop_threads(events)
    assert loops.select("rank", "tid").rows() == [(0, "2")]
    unnamed = events.with_columns(pl.lit(None, pl.Utf8).alias("thread_name")).filter(
        pl.col("name") != "aten::copy_"
    )
    assert gloo_threads.runloop_threads(unnamed).select("rank", "tid").rows() == [(0, "2")]


def test_a_runloop_thread_by_content_is_one_thread_of_one_rank():
    """Thread 2 of rank 0 carries only gloo collective spans: a runloop. Thread 2 of rank 1
    carries the same span and an op; thread 3 of rank 0 a gloo p2p span only (not a collective):
    neither is. A GPU row on rank 0's thread 2 changes nothing."""
    rows = [
        ev(0, "gloo:all_reduce", 0, 10, cat="user_annotation", kind="communication", tid="2"),
        ev(0, "gloo:send", 0, 10, cat="user_annotation", kind="communication", tid="3"),
        ev(0, "aten::mm", 0, 5, tid="2", device="gpu"),
        ev(1, "gloo:all_reduce", 0, 10, cat="user_annotation", kind="communication", tid="2"),
        ev(1, "aten::mm", 0, 5, tid="2"),
    ]
    loops = gloo_threads.runloop_threads(event_frame(rows))
    assert sorted(loops.select("rank", "tid").rows()) == [(0, "2")]


def test_gpu_rank_hta_rules():
    events, windows, seg = run_pipeline(GPU_RANK, {1})
    w = windows.row(0, named=True)
    # two complete steps; span from the first to the last kept GPU event
    assert (w["kind"], w["steps"], w["start_ns"], w["end_ns"]) == ("complete_steps", 2, 100, 1600)
    totals = breakdown.state_totals(seg).row(0, named=True)
    assert totals["compute"] + totals["overlap"] == 300
    assert totals["overlap"] == 100
    assert totals["comm"] == 200
    assert totals["other"] == 100
    assert totals["idle"] == 100 + 800  # [500,600] [700,1500]


def test_two_ranks_together_every_number():
    events, windows, seg = run_pipeline(CPU_RANK + GPU_RANK, {1})
    table = breakdown.rank_breakdown(seg, windows, timeline.step_markers(events), {0: 0, 1: 1})
    assert differences(table.iter_rows(named=True), {r["rank"]: r for r in known_ranks()}) == []
    assert table["node"].to_list() == [0, 1]


def test_hand_built_kineto_job_every_number(hand_built: list[Path]):
    """Ingest, timeline and breakdown together, from the JSON files."""
    result = analyze(hand_built[0].parent, cache=False)
    ranks = result.summary.ranks
    assert differences(ranks, {r["rank"]: r for r in known_ranks()}) == []
    assert [(r.window_start_ns, r.window_end_ns) for r in ranks] == [(0, 200), (100, 1600)]


def test_reference_gets_the_hand_built_numbers(hand_built: list[Path]):
    """The plain-Python reference the real-trace tests compare with is right where the answer
    is known."""
    assert differences(known_ranks(), rank_seconds(hand_built)) == []


def test_trace_without_step_markers_uses_whole_trace():
    rows = [r for r in CPU_RANK if not r["name"].startswith("ProfilerStep")]
    events, windows, seg = run_pipeline(rows, set())
    w = windows.row(0, named=True)
    assert (w["kind"], w["start_ns"], w["end_ns"]) == ("whole_trace", 10, 190)
    merged = timeline.merge_states(seg)
    assert merged["start_ns"].min() == 10 and merged["end_ns"].max() == 190
    # merged segments tile the window without gaps
    assert (
        merged["start_ns"].shift(-1).drop_nulls() == merged["end_ns"].head(merged.height - 1)
    ).all()


def test_blocking_wait_inside_an_autograd_op_is_not_compute():
    """FSDP2 waits for its all-gather inside autograd's evaluate_function op; on gloo the wait
    leaves no event, so only the communication label around it tells the time apart."""
    rows = [
        ev(0, "ProfilerStep#1", 0, 100, cat="user_annotation", kind="annotation"),
        ev(0, "autograd::engine::evaluate_function: AddmmBackward0", 10, 100),
        ev(0, "FSDP::pre_backward (blocks.0)", 20, 60, cat="user_annotation", kind="annotation"),
        ev(0, "aten::copy_", 25, 30),  # copy-out inside the label: compute
        ev(
            0,
            "gloo:all_gather",
            20,
            55,
            cat="user_annotation",
            kind="communication",
            tid="2",
            thread_name="pt_gloo_runloop",
            op="all_gather",
        ),
    ]
    events, windows, seg = run_pipeline(rows, set())
    totals = breakdown.state_totals(seg).row(0, named=True)
    assert totals["compute"] + totals["overlap"] == 10 + 5 + 40  # [10,20] [25,30] [60,100]
    assert totals["overlap"] == 5  # [25,30]
    assert totals["comm"] == 30  # [20,25] [30,55] exposed
    assert totals["idle"] == 10 + 5  # [0,10] [55,60]
