"""The comparison of runs: one row of numbers per run (:func:`compare_rows`, also the CLI's and
the report's table) and the figures drawn from those rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import plotly.graph_objects as go

from tracekit.figures.style import (
    MEMORY_PARTS,
    STATE_COLORS,
    STATE_LABELS,
    bar,
    byte_unit,
    layout,
    num,
    plain,
)
from tracekit.summary import Summary

Run = tuple[str, Summary]


def _mean(values: Iterable[float | None]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _median(values: Iterable[float | None]) -> float | None:
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _largest(values: Iterable[float | None]) -> float | None:
    """The largest known value; null (shown "–") when none is known, never 0."""
    known = [num(v) for v in values if v is not None]
    return max(known) if known else None


def compare_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per run: the numbers the comparison shows (also the CLI's and Markdown's table)."""
    out = []
    for name, s in runs:
        ranks = s.ranks
        mem = s.memory.per_rank if s.memory else []
        co, tr = s.collectives, s.traffic
        waits = _waits(s)
        out.append(
            {
                "run": name,
                "strategy": s.run.strategy if s.run else None,
                "ranks": len(ranks),
                "step_time_s": _median(r.step_time_s for r in ranks),
                "span_s": _mean(r.span_s for r in ranks),
                "compute_s": _mean(num(r.compute_s) - num(r.overlap_s) for r in ranks),
                "compute_total_s": _mean(r.compute_s for r in ranks),
                "overlap_s": _mean(r.overlap_s for r in ranks),
                "exposed_comm_s": _mean(r.exposed_comm_s for r in ranks),
                # exposed comm split into bytes moving and waiting on peers (why.wait_states);
                # null unless every rank's wait states are known
                "exposed_transfer_s": None if waits is None else _mean(w.transfer_s for w in waits),
                "waiting_s": None if waits is None else _mean(w.waiting_s for w in waits),
                "other_s": _mean(r.other_s for r in ranks),
                "idle_s": _mean(r.idle_s for r in ranks),
                "params_bytes": _largest(m.params_bytes for m in mem),
                "grads_bytes": _largest(m.grads_bytes for m in mem),
                "optimizer_bytes": _largest(m.optimizer_bytes for m in mem),
                "model_states_bytes": _largest(m.model_states_bytes for m in mem),
                "peak_bytes": _largest(m.peak_bytes for m in mem),
                # payload S of every rank's row, summed over ranks (collectives rank_bytes)
                "collective_bytes": co.bytes,
                # bytes on the wire, all links, whole window (traffic total_bytes)
                "wire_bytes": tr.total_bytes if tr else None,
                "ideal_bytes_per_rank": co.ideal_bytes_per_rank,
                "intra_node_bytes": tr.intra_node_bytes if tr else None,
                "inter_node_bytes": tr.inter_node_bytes if tr else None,
                "bubble_fraction": s.pipeline.bubble_fraction if s.pipeline else None,
                "allgather_hidden_fraction": (
                    s.overlap.allgather_hidden_fraction if s.overlap else None
                ),
                # the job's step time range over its steps (summary.json steps), for noise
                "step_min_s": s.steps.min_s if s.steps else None,
                "step_max_s": s.steps.max_s if s.steps else None,
                "step_spread": s.steps.spread if s.steps else None,
                "cpu_wait_share_max": s.contention.cpu_wait_share_max if s.contention else None,
            }
        )
    _versus_fastest(out)
    return out


def _waits(s: Summary) -> list[Any] | None:
    """Every rank's wait-state row (summary.json why.wait_states.per_rank), or None unless all
    of the ranks have one."""
    per = {w.rank: w for w in (s.why.wait_states.per_rank if s.why else [])}
    if not s.ranks or any(r.rank not in per for r in s.ranks):
        return None
    return [per[r.rank] for r in s.ranks]


def _versus_fastest(rows: list[dict[str, Any]]) -> None:
    """Each row's ``vs_fastest``: its step time against the fastest run's, or "within noise"
    when the two runs' step ranges (shortest to longest step) overlap, so that the runs cannot
    be ranked; null without a step time or a range to judge by."""
    timed = [r for r in rows if r["step_time_s"] is not None]
    fastest = min(timed, key=lambda r: r["step_time_s"], default=None)
    for r in rows:
        r["vs_fastest"] = None
        if fastest is None or r["step_time_s"] is None:
            continue
        if r is fastest:
            r["vs_fastest"] = "fastest"
        elif None in (r["step_min_s"], fastest["step_max_s"]):
            continue  # no range: the difference cannot be judged against noise
        elif r["step_min_s"] <= fastest["step_max_s"]:
            r["vs_fastest"] = "within noise"
        else:
            slower = r["step_time_s"] / fastest["step_time_s"] - 1
            r["vs_fastest"] = f"+{slower:.0%}"


def compare_step_time(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not rows:
        return None
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    for key, name, color, short in (
        ("step_time_s", "step time (median)", "#4c78a8", "step"),
        ("span_s", "window span (mean of ranks)", "#9ecae1", "span"),
    ):
        fig.add_trace(bar(x, [r[key] for r in rows], name, color, short + " %{y:.6f} s"))
    return layout(fig, "step time per run", barmode="group", yaxis_title="seconds")


def compare_breakdown(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not rows:
        return None
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    # exposed comm as transfer + waiting on peers when every run's wait states are known
    split = all(r["waiting_s"] is not None for r in rows)
    exposed = (("transfer", "exposed_transfer_s"), ("waiting", "waiting_s"))
    for state, key in (
        ("compute", "compute_s"),
        ("overlap", "overlap_s"),
        *(exposed if split else (("comm", "exposed_comm_s"),)),
        ("other", "other_s"),
        ("idle", "idle_s"),
    ):
        label = STATE_LABELS[state]
        fig.add_trace(
            bar(
                x,
                [100 * num(r[key]) / r["span_s"] if r["span_s"] else 0 for r in rows],
                label,
                STATE_COLORS[state],
                label + ": %{y:.1f}% of the span",
            )
        )
    return layout(
        fig,
        "where the time goes (mean over ranks, % of the window)",
        barmode="stack",
        yaxis_title="% of span",
    )


def compare_memory(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not any(r["model_states_bytes"] is not None for r in rows):
        return None
    peak = max(num(r["peak_bytes"]) + num(r["model_states_bytes"]) for r in rows)
    div, unit = byte_unit(peak)
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    for key, label, color in MEMORY_PARTS[:3]:
        hover = label + " %{y:.3f} " + unit
        fig.add_trace(bar(x, [num(r[key]) / div for r in rows], label, color, hover))
    theory = []
    for _, s in runs:
        t = s.memory.theory if s.memory else None
        theory.append(
            None if t is None or t.model_states_bytes is None else t.model_states_bytes / div
        )
    if any(t is not None for t in theory):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=theory,
                mode="markers",
                name="theory: model states",
                marker=dict(symbol="line-ew-open", size=30, color="#d62728", line=dict(width=3)),
            )
        )
    return layout(
        fig, "model states per rank (largest rank of each run)", barmode="stack", yaxis_title=unit
    )


def compare_bytes(runs: Sequence[Run]) -> go.Figure | None:
    rows = compare_rows(runs)
    if not rows:
        return None
    keys = (
        ("collective_bytes", "payload bytes, summed over ranks", "#4c78a8"),
        ("ideal_bytes_per_rank", "ideal bytes per rank (S x bus factor)", "#9ecae1"),
        ("intra_node_bytes", "intra-node wire bytes", "#54a24b"),
        ("inter_node_bytes", "inter-node wire bytes", "#e45756"),
    )
    peak = max([num(r[k]) for r in rows for k, _, _ in keys] + [1])
    div, unit = byte_unit(peak)
    x = [plain(r["run"]) for r in rows]
    fig = go.Figure()
    for key, label, color in keys:
        if all(r[key] is None for r in rows):
            continue
        y = [None if r[key] is None else num(r[key]) / div for r in rows]
        fig.add_trace(bar(x, y, label, color, label + " %{y:.3f} " + unit))
    return layout(fig, "bytes communicated per run", barmode="group", yaxis_title=unit)


COMPARE_FIGURES: dict[str, Callable[[Sequence[Run]], go.Figure | None]] = {
    "compare_step_time": compare_step_time,
    "compare_breakdown": compare_breakdown,
    "compare_memory": compare_memory,
    "compare_bytes": compare_bytes,
}


def compare_figures(runs: Sequence[Run]) -> dict[str, go.Figure | None]:
    """Every comparison figure of RUNS ((name, Summary) pairs) by name."""
    return {name: fn(runs) for name, fn in COMPARE_FIGURES.items()}
