"""Every figure on a synthetic Analysis that has every section, and on real traces.

The synthetic analysis (tests/builders/analyses.py: ``synthetic_analysis``) is a 4-rank, 2-node
GPipe run with every summary section and frame the analyses produce (pipeline, overlap, memory,
traffic, collectives), so each figure is exercised before real pipeline/ZeRO runs exist;
``big_timeline`` is up to 64 ranks and 1,000,000 events for the speed checks.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
import pytest
from builders.analyses import big_timeline, synthetic_analysis
from conftest import HTA

from tracekit import figures as F
from tracekit.analysis import Analysis, analyze
from tracekit.figures.binning import MAX_BINS, MAX_CELLS, bin_states
from tracekit.figures.style import STATE_LABELS, STATES


@pytest.fixture(scope="module")
def syn() -> Analysis:
    return synthetic_analysis()


@pytest.fixture(scope="module")
def real() -> Analysis:
    return analyze(HTA / "trace_filter")


def _kinds(fig: go.Figure) -> list[str]:
    return [t.type for t in fig.data]


def test_every_figure_on_the_synthetic_analysis(syn):
    figs = F.figures_for(syn)
    # every figure but tracekit predict's curve (the synthetic run has no calls to replay) and
    # the why page's (no matched calls: no waits, no critical path frame)
    assert [k for k, f in figs.items() if f is None] == ["predict_curve", "why_path", "why_matrix"]
    assert _kinds(figs["breakdown"]) == ["bar"] * 5
    tl = figs["timeline"]
    assert _kinds(tl).count("heatmap") == 1
    assert {t.name for t in tl.data if t.type == "bar"} == {
        "bubble: fill",
        "bubble: steady",
        "bubble: drain",
    }
    pipe = figs["pipeline"]
    names = [t.name for t in pipe.data]
    assert {"forward", "backward", "bubble: fill", "bubble: drain"} <= set(names)
    # measured + replay rows: forward and backward twice
    assert names.count("forward") == 2 and names.count("backward") == 2
    text = " ".join(a.text for a in pipe.layout.annotations)
    assert "measured 45.0%" in text and "replay 43.0%" in text and "(p-1)/(m+p-1) 42.9%" in text
    ov = figs["overlap"]
    assert len(ov.data) == 4  # hidden + exposed for all-gather and reduce-scatter
    assert "all-gather: 70.0% hidden" in ov.layout.annotations[0].text
    mem = figs["memory"]
    assert [t.name for t in mem.data][:4] == ["params", "grads", "optimizer", "activations (peak)"]
    assert any(t.name == "theory: model states" for t in mem.data)
    # only model states stack; the activation peak is a marker (a stack of all four stood
    # above the measured peak)
    assert [t.type for t in mem.data][:4] == ["bar", "bar", "bar", "scatter"]
    # bubble-fill and backward are told apart (they were two near-identical oranges)
    fill = next(t for t in pipe.data if t.name == "bubble: fill").marker.color
    back = next(t for t in pipe.data if t.name == "backward").marker.color
    assert fill != back and not (fill.startswith("#e") and back.startswith("#f")), (fill, back)
    assert len(figs["traffic_split"].data) == 2
    mat = figs["traffic_matrix"]
    assert (
        _kinds(mat) == ["heatmap"] and len(mat.layout.shapes) == 2
    )  # one node boundary, both axes
    assert len(figs["collective_bandwidth"].data) == 3
    assert [t.name for t in figs["collective_time"].data] == [
        "transfer",
        "wait for peers",
        "duration (split unknown: peers missing)",
    ]
    assert len(figs["pipeline_stages"].data) == 4


@pytest.mark.corpus
def test_compare_figures(syn, real):
    runs = [("gpipe", syn.summary), ("trace_filter", real.summary)]
    figs = F.compare_figures(runs)
    assert all(f is not None for f in figs.values())
    assert list(figs["compare_step_time"].data[0].x) == ["gpipe", "trace_filter"]
    assert len(figs["compare_breakdown"].data) == 5
    rows = F.compare_rows(runs)
    assert rows[1]["model_states_bytes"] is None and rows[0]["model_states_bytes"] == 16 * 2**20


@pytest.mark.corpus
def test_missing_sections_give_none(real):
    figs = F.figures_for(real)
    for name in (
        "pipeline",
        "pipeline_stages",
        "overlap",
        "memory",
        "traffic_split",
        "traffic_matrix",
    ):
        assert figs[name] is None, name
        assert F.NO_DATA[name].startswith("this run has no")
    assert figs["breakdown"] is not None and figs["timeline"] is not None


@pytest.mark.corpus
def test_real_trace_figures(real):
    figs = F.figures_for(real)
    assert [t.x for t in figs["breakdown"].data][0] == ("rank 0", "rank 1")
    tl = figs["timeline"]
    heat = tl.data[0]
    assert heat.type == "heatmap"
    z = np.asarray(heat.z)
    assert z.shape == (2, tl.layout.meta["bins"]) and tl.layout.meta["bins"] <= MAX_BINS
    assert np.nanmax(z) < len(STATES)
    # share columns of each cell sum to ~100 %
    cd = np.asarray(heat.customdata, dtype=float)
    full = cd[:, 5:-5, :5].sum(axis=2)
    assert np.all((full > 95) & (full < 105))
    detail = F.timeline_detail(real.timeline, 0.1, 0.12, events=real.events)
    assert detail.layout.meta["mode"] == "detail"
    bars = [t for t in detail.data if t.type == "bar" and t.name in STATE_LABELS.values()]
    assert sum(len(t.x) for t in bars) == detail.layout.meta["bars"] > 0
    ev = [t for t in detail.data if (t.name or "").startswith("events:")]
    assert ev and all("µs" in h for t in ev for h in t.hovertext)


def test_heatmap_bins_are_capped():
    ev, tl = big_timeline(8, 50_000)
    fig = F.timeline_overview(tl, bins=10_000)
    assert fig.layout.meta["bins"] == MAX_BINS
    assert np.asarray(fig.data[0].z).shape == (8, MAX_BINS)
    ev, tl = big_timeline(64, 64_000)
    fig = F.timeline_overview(tl)
    assert fig.layout.meta["bins"] * 64 <= MAX_CELLS


def test_bins_split_spans_exactly():
    tl = pl.DataFrame(
        {
            "rank": [0, 0, 1],
            "start_ns": [0, 250, 0],
            "end_ns": [250, 1000, 1000],
            "state": ["compute", "idle", "comm"],
        }
    )
    ns = bin_states(tl, [0, 1], 0, 1000, 4)
    assert ns[0, :, 0].tolist() == [250, 0, 0, 0]
    assert ns[0, :, 4].tolist() == [0, 250, 250, 250]
    assert ns[1, :, 2].tolist() == [250] * 4
    assert ns.sum() == 2000


def test_detail_falls_back_to_bins_beyond_the_cap():
    ev, tl = big_timeline(4, 40_000)
    wide = F.timeline_detail(tl, 0, 10.0, events=ev)
    assert wide.layout.meta["mode"] == "binned"
    narrow = F.timeline_detail(tl, 0.01, 0.0102, events=ev)
    assert narrow.layout.meta["mode"] == "detail" and 0 < narrow.layout.meta["bars"] <= F.MAX_BARS


def test_big_timeline_stays_small():
    """64 ranks, 1M spans: the payloads stay small (build times: benchmarks/timing_bounds.py)."""
    ev, tl = big_timeline(64, 1_000_000)
    assert ev.height == 1_000_000 and tl.height >= 1_000_000
    fig = F.timeline_overview(tl)
    assert len(fig.to_json()) < 2_000_000
    detail = F.timeline_detail(tl, 0.2, 0.2004, events=ev)
    assert detail.layout.meta["mode"] == "detail" and 0 < detail.layout.meta["bars"] <= F.MAX_BARS


def test_trace_text_is_data_not_markup(syn):
    fig = F.timeline_detail(
        syn.timeline, 0, 0.05, events=syn.events, bubbles=F.frame(syn, "bubbles")
    )
    hover = [h for t in fig.data if t.hovertext is not None for h in t.hovertext]
    assert any("&lt;img src=x onerror=alert(1)&gt;" in h for h in hover)
    assert not any("<img" in h for h in hover)
    # plotly's JSON writes '<' as \u003c: no markup can close a <script> from figure data
    assert "<img" not in fig.to_json() and "</" not in fig.to_json()


def test_the_breakdown_shows_waiting_on_peers_as_its_own_state():
    """On the sample 1F1B run a stage waiting for its predecessor's activations is waiting, not
    communication: the breakdown's exposed part is transfer + waiting, and waiting dominates."""
    from pathlib import Path

    from tracekit.analysis import analyze

    a = analyze(Path(__file__).resolve().parents[1] / "sample_traces" / "pp-1f1b")
    fig = F.figures_for(a)["breakdown"]
    bars = {t.name: list(t.y) for t in fig.data}
    assert "exposed comm" not in bars
    waits = {w.rank: w for w in a.summary.why.wait_states.per_rank}
    for i, r in enumerate(a.summary.ranks):
        moved, waited = bars["exposed transfer"][i], bars["waiting on peers"][i]
        assert moved + waited == pytest.approx(r.exposed_comm_s)
        assert waited == pytest.approx(waits[r.rank].waiting_s)
    assert sum(bars["waiting on peers"]) > 5 * sum(bars["exposed transfer"])


def test_the_timeline_marks_where_each_step_starts():
    from pathlib import Path

    from tracekit.analysis import analyze

    a = analyze(Path(__file__).resolve().parents[1] / "sample_traces" / "pp-gpipe")
    steps = a.frame("steps")
    assert steps.height >= 2 and steps.height == a.summary.steps.steps
    fig = F.figures_for(a)["timeline"]
    assert fig.layout.meta["steps"] == steps.height
    t0 = fig.layout.meta["t0_ns"]
    xs = sorted(sh.x0 for sh in fig.layout.shapes if sh.line.dash == "dot")
    assert xs == pytest.approx([(s - t0) * 1e-9 for s in steps["start_ns"].to_list()])
    texts = [an.text for an in fig.layout.annotations if an.text.startswith("step ")]
    assert texts == [f"step {s}" for s in steps["step"].to_list()]


def test_the_why_timeline_draws_the_states_the_summary_counts():
    """The why page's bands per rank add up to that rank's compute, waiting and transfer of
    summary.json why.wait_states.per_rank (a band drawn over another would not)."""
    from pathlib import Path

    from tracekit.analysis import analyze

    a = analyze(Path(__file__).resolve().parents[1] / "sample_traces" / "pp-1f1b")
    fig = F.figures_for(a)["why_path"]
    drawn: dict[str, dict[int, float]] = {}
    for t in fig.data:
        if t.name == "critical path":
            continue
        xs, ys = list(t.x), list(t.y)
        per = drawn.setdefault(t.name, {})
        for i in range(0, len(xs), 3):
            per[int(ys[i])] = per.get(int(ys[i]), 0.0) + (xs[i + 1] - xs[i]) * 1e-3
    for row, w in enumerate(a.summary.why.wait_states.per_rank):
        assert drawn["waiting"][row] == pytest.approx(w.waiting_s, rel=1e-6)
        assert drawn["transfer"][row] == pytest.approx(w.transfer_s, rel=1e-6)
