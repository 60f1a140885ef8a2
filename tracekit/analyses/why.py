"""summary.json ``why``: wait states -> root causes -> critical path, and the diagnosis lines.

tracekit.analyses.wait_states (Scalasca's patterns), .root_causes (Böhme et al. 2010),
.critical_path (Böhme et al. 2012) on the section input; this module runs them and words the
result (``diagnosis``: the first line names the top delaying rank).
"""

from __future__ import annotations

import statistics

import msgspec
import numpy as np
import polars as pl

from tracekit.analyses import critical_path as cp
from tracekit.analyses import intervals as iv
from tracekit.analyses import root_causes as rc
from tracekit.analyses import wait_states as ws
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.summary.why import (
    Cause,
    CauseLabel,
    CauseRank,
    CriticalPath,
    PathOp,
    PathRank,
    PathState,
    RootCauses,
    WaitPair,
    WaitPattern,
    WaitRank,
    WaitStates,
    WhatIf,
    Why,
)

NS = 1e-9
MATRIX_SCHEMA = {"waiter": pl.Int32, "cause": pl.Int32, "wait_ns": pl.Int64, "calls": pl.UInt32}
#: a cause under this share of the mean rank span holds nobody up (Why.top_cause)
SMALL = 0.10


def why_section(inp: SectionInput) -> SectionResult[Why]:
    """summary.json ``why`` and the frames wait_states, wait_matrix, root_causes, critical_path."""
    if inp.windows.height == 0:
        return SectionResult()
    calls, warnings = ws.by_order(inp.collectives)
    waits = ws.wait_rows(calls)
    segs = ws.timelines(inp)
    states, sets = ws.rank_states(segs, waits, inp.windows)
    # who waits on whom in blocked time, each instant once: summed per call, a rank with
    # several calls in flight (p2p receives posted ahead, DP buckets) waited longer than its span
    blocked = exposed_waits(waits, sets)
    mat = ws.matrix(blocked).cast(MATRIX_SCHEMA)  # type: ignore[arg-type]
    ops = rc.ops_of(inp.per_rank.top_ops)  # computed per rank by the map
    starts = dict(
        zip(inp.windows["rank"].to_list(), inp.windows["start_ns"].to_list(), strict=True)
    )
    causes, inst = rc.root_causes(blocked, sets, ops, starts)
    steps = cp.steps_of(inp.markers, inp.windows)
    path = cp.walk(steps, waits)
    value = Why(
        diagnosis=[],
        top_cause=None,
        wait_states=_wait_states(waits, states, mat),
        root_causes=_root_causes(causes, inst),
        critical_path=_critical_path(path, sets, ops, len(segs)),
    )
    spans = states["span_s"].to_list()
    top = value.root_causes.per_rank[0] if value.root_causes.per_rank else None
    mean_span = statistics.fmean(spans) if spans else 0.0
    if top is not None and mean_span > 0 and top.cost_s >= SMALL * mean_span:
        value = msgspec.structs.replace(value, top_cause=top.rank)
    if value.top_cause is not None:
        what_if, problem = _what_if(inp, segs, states, value.top_cause)
        value = msgspec.structs.replace(value, what_if=what_if)
        warnings = [*warnings, problem] if problem else warnings
    value = msgspec.structs.replace(value, diagnosis=diagnosis(value, inp))
    frames = {
        "wait_states": waits,
        "wait_matrix": mat,
        "rank_states": states,
        "root_causes": causes,
        "critical_path": path,
    }
    return SectionResult(value, frames, warnings)


def _what_if(
    inp: SectionInput, segs: dict[int, pl.DataFrame], states: pl.DataFrame, rank: int
) -> tuple[WhatIf | None, str | None]:
    """why.what_if (tracekit.analyses.straggler_replay.without), or None and why not."""
    from tracekit.analyses import network_program as npg
    from tracekit.analyses import straggler_replay as sr

    steps = dict(zip(inp.windows["rank"].to_list(), inp.windows["steps"].to_list(), strict=True))
    # work: what the replay runs at measured pace (the span less waiting and exposed transfer)
    work = {
        int(row["rank"]): (row["compute_s"] + row["other_s"] + row["idle_s"])
        / max(1, int(steps.get(row["rank"]) or 1))
        for row in states.iter_rows(named=True)
    }
    try:
        calls = npg.calls_table(inp.collectives, inp.nodes)
        timeline = pl.concat(list(segs.values())) if segs else pl.DataFrame()
        progs = npg.programs(inp.events, timeline, inp.collectives, inp.markers, inp.windows, calls)
        got = sr.without(progs, calls, rank, work)
    except (ValueError, KeyError) as exc:  # a replay that cannot run leaves the rest standing
        return None, f"why: the straggler what-if could not be replayed ({exc})"
    if got is None:
        return None, None
    return (
        WhatIf(
            rank=rank,
            speed=got["speed"],
            work_s=got["work_s"],
            peer_work_s=got["peer_work_s"],
            step_s=got["step_time_s"],
            replayed_step_s=got["replayed_step_time_s"],
            measured_step_s=got["measured_step_time_s"],
        ),
        None,
    )


def exposed_waits(waits: pl.DataFrame, sets: dict[int, rc.Sets]) -> pl.DataFrame:
    """The waits with ``wait_ns`` cut to the time the waiter was blocked, each instant once.

    A rank with several asynchronous calls in flight (DP's gradient buckets, FSDP's prefetched
    gathers) waits on all of them at once: summed, its waits exceed its span. Here each wait
    keeps only the part of [start, start + wait] that is in the rank's ``waiting`` state
    (exposed communication inside a wait interval) and not already claimed by a wait that
    started earlier, so a rank's waits sum to its ``waiting_s`` and the root causes charge
    each second of waiting once (docs/metrics.md "Why")."""
    if waits.height == 0:
        return waits
    parts = []
    for (rank,), w in waits.partition_by("rank", as_dict=True, maintain_order=True).items():
        w = w.sort("start_ns", "call_id")
        s = w["start_ns"].to_numpy().astype(np.int64)
        e = s + w["wait_ns"].to_numpy().astype(np.int64)
        reach = np.maximum.accumulate(e)  # the end of the waits begun so far
        lo = np.maximum(s, np.concatenate([[np.iinfo(np.int64).min], reach[:-1]]))
        b0, b1 = sets[int(rank)]["waiting"] if int(rank) in sets else (e[:0], e[:0])
        parts.append(w.with_columns(pl.Series("wait_ns", iv.inside(b0, b1, lo, e), pl.Int64)))
    return pl.concat(parts).sort("start_ns", "call_id", "rank")


def _wait_states(waits: pl.DataFrame, states: pl.DataFrame, mat: pl.DataFrame) -> WaitStates:
    waited = dict(waits.group_by("rank").agg(pl.col("wait_ns").sum()).iter_rows())
    caused = dict(
        waits.filter(pl.col("rank") != pl.col("last_rank"))
        .group_by("last_rank")
        .agg(pl.col("wait_ns").sum())
        .iter_rows()
    )
    per_rank = [
        WaitRank(
            **{k: v for k, v in row.items() if k != "overlap_s"},
            waited_s=waited.get(row["rank"], 0) * NS,
            caused_s=caused.get(row["rank"], 0) * NS,
        )
        for row in states.to_dicts()
    ]
    calls = waits.group_by("call_id").agg(pl.col("last_arrival_ns").first(), pl.col("end_ns").min())
    transfer = calls.select((pl.col("end_ns") - pl.col("last_arrival_ns")).clip(0).sum()).item()
    patterns = (
        waits.filter(pl.col("wait_ns") > 0)
        .group_by("pattern")
        .agg(pl.col("wait_ns").sum(), pl.len())
        .sort("wait_ns", "pattern", descending=[True, False])
    )
    return WaitStates(
        calls=calls.height,
        wait_s=int(waits["wait_ns"].sum()) * NS,
        transfer_s=int(transfer or 0) * NS,
        per_rank=per_rank,
        pairs=[
            WaitPair(waiter=w, cause=c, wait_s=t * NS, calls=n) for w, c, t, n in mat.iter_rows()
        ],
        patterns=[
            WaitPattern(pattern=p, wait_s=t * NS, rows=n) for p, t, n in patterns.iter_rows()
        ],
    )


def _root_causes(causes: pl.DataFrame, inst: pl.DataFrame) -> RootCauses:
    total = int(inst["wait_ns"].sum()) if inst.height else 0
    untraced = pl.col("what") == rc.BEFORE_TRACE
    before = int(causes.filter(untraced)["cost_ns"].sum())
    causes = causes.filter(~untraced)  # not a cause in the trace: in no rank's cost
    per = (
        causes.group_by("rank")
        .agg(pl.col("cost_ns").sum())
        .sort("cost_ns", "rank", descending=[True, False])
    )
    return RootCauses(
        wait_s=total * NS,
        direct_s=(int(inst["direct_ns"].sum()) if inst.height else 0) * NS,
        propagated_s=(int(inst["propagated_ns"].sum()) if inst.height else 0) * NS,
        before_trace_s=before * NS,
        per_rank=[
            CauseRank(rank=r, cost_s=c * NS, share=c / total if total else 0.0)
            for r, c in per.iter_rows()
        ],
        top=[
            Cause(rank=r, what=w, kind=k, label=lab, cost_s=c * NS)
            for r, w, k, lab, c in causes.head(10).iter_rows()
        ],
        by_label=[
            CauseLabel(rank=r, label=lab, cost_s=c * NS)
            for r, lab, c in causes.filter(pl.col("label").is_not_null())
            .group_by("rank", "label")
            .agg(pl.col("cost_ns").sum())
            .sort("cost_ns", "rank", "label", descending=[True, False, False])
            .iter_rows()
        ],
    )


def _critical_path(
    path: pl.DataFrame, sets: dict[int, rc.Sets], ops: dict[int, rc.Ops], ranks: int
) -> CriticalPath | None:
    if path.height == 0:
        return None
    per_rank, per_state, top = cp.shares(path, sets, ops)
    lengths = path.group_by("step").agg((pl.col("end_ns") - pl.col("start_ns")).sum())["end_ns"]
    length = int(lengths.sum())
    return CriticalPath(
        steps=lengths.len(),
        length_s=length * NS,
        step_s=float(lengths.median() or 0) * NS,  # type: ignore[arg-type]
        per_rank=[
            PathRank(rank=r, seconds=v * NS, share=v / length if length else 0.0)
            for r, v in sorted(per_rank.items(), key=lambda x: (-x[1], x[0]))
        ],
        per_state=[
            PathState(state=s, seconds=v * NS, share=v / length if length else 0.0)
            for s, v in per_state.items()
        ],
        top_ops=[PathOp(rank=r, name=n, seconds=v * NS) for r, n, v in top[:10]],
        note="one rank: no cross-rank waits" if ranks == 1 else None,
    )


def _short(name: str, width: int = 60) -> str:
    """An op name cut for a line (GPU kernels' template names run to pages)."""
    return name if len(name) <= width else name[: width - 1] + "…"


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def diagnosis(w: Why, inp: SectionInput) -> list[str]:
    """The few lines of `tracekit why`: the top delaying rank first."""
    lines = []
    rcs, wst, path = w.root_causes, w.wait_states, w.critical_path
    if w.top_cause is not None:
        top = rcs.per_rank[0]
        what = [c for c in rcs.top if c.rank == top.rank][:2]
        doing = ", ".join(
            f"{_short(c.what)}{f' in {c.label}' if c.label else ''} {c.cost_s:.3g} s" for c in what
        )
        lines.append(
            f"rank {top.rank} holds the others up: {top.cost_s:.3g} s of their waits "
            f"({_pct(top.share)} of {rcs.wait_s:.3g} s) are charged to it ({doing})"
        )
    elif len(wst.per_rank) > 1:
        lines.append(
            f"no rank holds the others up: waits on peers total {rcs.wait_s:.3g} s, none charged "
            f"more than {_pct(SMALL)} of a rank's span"
        )
    else:
        lines.append("one rank: no cross-rank waits")
    if rcs.before_trace_s > 0 and rcs.before_trace_s >= SMALL * rcs.wait_s:
        lines.append(
            f"{rcs.before_trace_s:.3g} s of the waits lie before the awaited rank's trace began "
            "(its profiler started later): their cause is not traced, charged to no rank"
        )
    if path is not None:
        step = f"step: {path.step_s:.3g} s" if path.step_s else "window"
        lines.append(f"{step} ({path.steps} step(s) walked, {path.length_s:.3g} s of path)")
        main = path.per_rank[0] if path.per_rank else None
        states = sorted(path.per_state, key=lambda s: -s.seconds)
        if main is not None:
            lines.append(
                f"critical path: rank {main.rank} {_pct(main.share)}; "
                + ", ".join(f"{s.state} {_pct(s.share)}" for s in states[:3] if s.seconds > 0)
                + (
                    f"; top op {_short(path.top_ops[0].name)} (rank {path.top_ops[0].rank})"
                    if path.top_ops
                    else ""
                )
            )
    for p in wst.pairs[:3]:
        lines.append(f"rank {p.waiter} waited {p.wait_s:.3g} s on rank {p.cause} ({p.calls} calls)")
    wi = w.what_if
    if wi is not None and wi.step_s is not None:
        measured = "–" if wi.measured_step_s is None else f"{wi.measured_step_s:.3g} s"
        lines.append(
            f"without rank {wi.rank}'s excess ({wi.speed:.2g}x its busiest peer's work) the "
            f"step would take {wi.step_s:.3g} s (measured {measured})"
        )
    return lines
