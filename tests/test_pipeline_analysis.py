"""The pipeline analysis on its own: the replay against hand simulations, traces that
torch.distributed.pipelining writes (a real 2-rank job), and the committed pipeline samples."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, SAMPLES, torchrun

from tracekit import theory
from tracekit.analyses.pipeline_ops import parse_op, pipeline_ops
from tracekit.analyses.replay import replay
from tracekit.analysis import analyze

# --- the replay: theory for uniform stages, hand simulations for non-uniform ones -------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 5)])
def test_replay_uniform_is_the_papers(schedule, p, m):
    r = replay(schedule, p, m, 1.0, 2.0)
    assert r.bubble_fraction == pytest.approx(theory.pipeline_bubble_fraction(p, m), abs=1e-12)


# p=3, m=2; per microbatch F = 1, 2, 1 and B = 2, 2, 1 on stages 0, 1, 2 (a slow middle stage).
F3, B3 = [1.0, 2.0, 1.0], [2.0, 2.0, 1.0]


def _timeline(r):
    return {
        (o["stage"], o["kind"], o["microbatch"]): (o["start"], o["end"]) for o in r.ops.to_dicts()
    }


def test_replay_gpipe_non_uniform_by_hand():
    """stage 0: F0 [0,1] F1 [1,2]; stage 1: F0 [1,3] F1 [3,5]; stage 2: F0 [3,4] F1 [5,6],
    B0 [6,7] B1 [7,8]; stage 1: B0 [7,9] B1 [9,11]; stage 0: B0 [9,11] B1 [11,13].
    Window 13, busy 6 + 8 + 4, bubble (39 - 18) / 39 = 7/13 (> the uniform 2/4? no: 0.538 > 0.5)."""
    r = replay("gpipe", 3, 2, F3, B3)
    assert _timeline(r) == {
        (0, "F", 0): (0, 1),
        (0, "F", 1): (1, 2),
        (1, "F", 0): (1, 3),
        (1, "F", 1): (3, 5),
        (2, "F", 0): (3, 4),
        (2, "F", 1): (5, 6),
        (2, "B", 0): (6, 7),
        (2, "B", 1): (7, 8),
        (1, "B", 0): (7, 9),
        (1, "B", 1): (9, 11),
        (0, "B", 0): (9, 11),
        (0, "B", 1): (11, 13),
    }
    assert r.makespan == 13 and r.bubble_fraction == pytest.approx(7 / 13)
    assert [(s["fill"], s["steady"], s["drain"]) for s in r.per_stage.to_dicts()] == [
        (0, 7, 0),
        (1, 2, 2),
        (3, 1, 5),
    ]


def test_replay_1f1b_non_uniform_by_hand():
    """The last stage alternates F0 B0 F1 B1, so stage 1's B0 starts at 5 instead of 7:
    stage 2: F0 [3,4] B0 [4,5] F1 [5,6] B1 [6,7]; stage 1: B0 [5,7] B1 [7,9]; stage 0: B0 [7,9]
    B1 [9,11]. Window 11, bubble (33 - 18) / 33 = 5/11: below the uniform theory 1/2, since the
    slow stage's backwards start early."""
    r = replay("1f1b", 3, 2, F3, B3)
    t = _timeline(r)
    assert (t[(2, "B", 0)], t[(2, "F", 1)], t[(1, "B", 0)], t[(0, "B", 1)]) == (
        (4, 5),
        (5, 6),
        (5, 7),
        (9, 11),
    )
    assert r.makespan == 11 and r.bubble_fraction == pytest.approx(5 / 11)
    assert r.per_stage["max_inflight"].to_list() == [2, 2, 1]


def test_torch_label_formats():
    assert parse_op("Forward 3")["kind"] == "F" and parse_op("Backward 0")["microbatch"] == 0
    assert parse_op("Forward 3")["stage"] is None  # the rank's position decides
    assert (parse_op("PP:2F1")["stage"], parse_op("PP:2F1")["microbatch"]) == (2, 1)
    assert parse_op("PP:0I3")["kind"] == "B" and parse_op("PP:1W0")["kind"] == "W"
    for not_compute in (
        "PP:2SEND_F0",
        "PP:0RECV_B1",
        "PP:0UNSHARD",
        "PP:2REDUCE_GRAD",
        "PP:(0F1;1B0)OVERLAP_F_B",
    ):
        assert parse_op(not_compute) is None
    assert parse_op("B:s1:mb17:v3:st2") == {
        "kind": "B",
        "stage": 1,
        "microbatch": 17,
        "version": 3,
        "staleness": 2,
        "source": "tracekit",
    }


def test_busy_time_of_tracekit_and_torch_spans():
    """torch's ``Forward i`` holds its receive: narrowed to its first and last compute op. Our
    ``F``/``B`` labels hold only the stage's compute, so the Python before the first op counts
    as busy; blocking communication inside a span is subtracted either way."""

    def ev(rank: int, name: str, kind: str, cat: str, s: int, e: int) -> dict:
        return {
            "rank": rank,
            "device": "cpu",
            "tid": "1",
            "cat": cat,
            "name": name,
            "kind": kind,
            "start_ns": s,
            "end_ns": e,
        }

    events = pl.DataFrame(
        [
            ev(0, "F:s0:mb0", "annotation", "user_annotation", 0, 1000),
            ev(0, "aten::mm", "compute", "cpu_op", 200, 900),
            ev(0, "B:s0:mb0", "annotation", "user_annotation", 2000, 3000),
            ev(0, "aten::mm", "compute", "cpu_op", 2100, 2400),
            ev(0, "c10d::recv_", "communication", "cpu_op", 2400, 2600),
            ev(0, "aten::mm", "compute", "cpu_op", 2600, 2900),
            ev(1, "Forward 0", "annotation", "user_annotation", 0, 1000),
            ev(1, "aten::mm", "compute", "cpu_op", 300, 800),
        ]
    ).with_columns(pl.col("rank").cast(pl.Int32))
    ops, _, _ = pipeline_ops(events, pl.DataFrame())
    got = {
        (r, k): (s, e, b)
        for r, k, s, e, b in ops.select("rank", "kind", "start_ns", "end_ns", "busy_ns").iter_rows()
    }
    assert got == {
        (0, "F"): (0, 1000, 1000),
        (0, "B"): (2000, 3000, 800),
        (1, "F"): (300, 800, 500),
    }


def test_no_pipeline_labels_no_section():
    result = analyze(SAMPLES / "dp")
    assert result.summary.pipeline is None
    assert not {"pipeline_ops", "bubbles", "pipeline_replay"} & set(result.frames)


# --- a user's own job: torch.distributed.pipelining, 2 ranks, gloo ------------------------------------


@pytest.fixture(scope="module")
def torch_traces(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("torch_pp")
    torchrun(ROOT / "tests" / "pipelining_job.py", out, cwd=out)
    return out


@pytest.mark.slow
def test_torch_writes_these_labels(torch_traces):
    """What torch 2.13 really writes (documented in tracekit/analyses/pipeline.py)."""
    names = {}
    for kind in ("gpipe", "interleaved"):
        trace = json.loads((torch_traces / kind / "rank0.json").read_text())
        names[kind] = {
            e["name"]
            for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "user_annotation"
        }
    assert {"Forward 0", "Forward 3", "Backward 0", "Backward 3"} <= names["gpipe"]
    assert not any(n.startswith("PP:") for n in names["gpipe"])
    assert {"PP:0F0", "PP:2F3", "PP:0B0", "PP:2B3"} <= names["interleaved"]
    assert any(n.startswith("PP:0SEND_F") for n in names["interleaved"])
    assert any(n.startswith("PP:2RECV_F") for n in names["interleaved"])


@pytest.mark.slow
def test_torch_schedule_gpipe_per_stage_bubbles(torch_traces):
    result = analyze(torch_traces / "gpipe")
    pipe = result.summary.pipeline
    assert (pipe.schedule, pipe.stages, pipe.microbatches, pipe.steps) == (
        "gpipe",
        2,
        4,
        2,
    )
    assert "ScheduleGPipe" in pipe.source
    assert pipe.bubble_fraction_theory == pytest.approx(1 / 5)
    assert 0 < pipe.bubble_fraction < 1 and 0 < pipe.bubble_fraction_replay < 1
    assert [s.stage for s in pipe.per_stage] == [0, 1]
    for s in pipe.per_stage:
        assert s.max_inflight_microbatches == 4  # GPipe: all m on every stage
        assert s.steady_s + s.fill_s + s.drain_s > 0
        assert s.fill_s + s.steady_s + s.drain_s + s.busy_s == pytest.approx(s.window_s, rel=1e-6)
    # stage 1 waits for stage 0's first forward (fill); stage 0 runs the step's last backward
    assert pipe.per_stage[1].fill_s > 0 and pipe.per_stage[0].drain_s == 0
    ops = result.frames["pipeline_ops"]
    assert ops.height == 2 * 2 * 4 * 2
    # stage 1's "Forward i" holds the blocking receive: each op is trimmed to its compute
    ev = result.events
    raw = (
        ev.filter((ev["rank"] == 1) & ev["name"].str.starts_with("Forward "))
        .sort("start_ns")["start_ns"]
        .to_list()
    )
    got = (
        ops.filter((ops["rank"] == 1) & (ops["kind"] == "F")).sort("start_ns")["start_ns"].to_list()
    )
    assert (
        len(raw) == len(got)
        and all(g >= r for g, r in zip(got, raw))
        and any(g > r for g, r in zip(got, raw))
    )
    bubbles = result.frames["bubbles"]
    assert set(bubbles["rank"].unique()) == {0, 1} and bubbles.height > 0


@pytest.mark.slow
def test_torch_interleaved_schedule_is_read(torch_traces):
    pipe = analyze(torch_traces / "interleaved").summary.pipeline
    assert (pipe.schedule, pipe.stages, pipe.virtual_stages, pipe.microbatches) == (
        "interleaved",
        2,
        4,
        4,
    )
    assert pipe.bubble_fraction_theory == pytest.approx(1 / (2 * 4 + 1))  # (p-1)/(v m + p-1)
    assert pipe.bubble_fraction_replay is None
    assert [s.stages_on_rank for s in pipe.per_stage] == [[0, 2], [1, 3]]
    assert all(0 < s.busy_s < s.window_s for s in pipe.per_stage)


# --- the committed samples: p=4, m=4, made by `tracekit run pp-* --nproc 4 --microbatches 4 --steps 2`


def _sample(name: str) -> dict:
    """summary.json ``pipeline`` of a sample, as written."""
    return analyze(SAMPLES / name).summary_dict()["pipeline"]


def test_samples_inflight_activation_and_versions():
    gp, of, pd = _sample("pp-gpipe"), _sample("pp-1f1b"), _sample("pp-pipedream")
    p, m = gp["stages"], gp["microbatches"]
    assert [s["max_inflight_microbatches"] for s in gp["per_stage"]] == [m] * p
    assert [s["max_inflight_microbatches"] for s in of["per_stage"]] == [p - r for r in range(p)]
    for g, o in zip(gp["per_stage"], of["per_stage"]):  # activation peaks in the same ratio m/(p-r)
        assert g["activation_peak_bytes"] / o["activation_peak_bytes"] == pytest.approx(
            m / (p - g["stage"]), rel=0.02
        )
    assert [s["weight_versions"] for s in pd["per_stage"]] == [p - s for s in range(p)]
    assert pd["bubble_fraction_span"] < gp["bubble_fraction_span"]


def test_a_subset_of_ranks_gets_theory_not_replay():
    pipe = analyze(SAMPLES / "pp-1f1b", ranks=[0, 1])
    summary = pipe.summary.pipeline
    assert summary.stages == 4 and [s.stage for s in summary.per_stage] == [0, 1]
    assert summary.bubble_fraction_replay is None
    assert summary.bubble_fraction_theory == pytest.approx(theory.pipeline_bubble_fraction(4, 4))
    assert any("no replay" in w for w in pipe.summary.warnings)
