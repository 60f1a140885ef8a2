"""Clock alignment for traces from several hosts: offsets from collectives that end together.

Ranks on one host share a clock (``baseTimeNanoseconds + ts*1000`` is that host's epoch time);
hosts differ by whatever NTP left, often milliseconds, enough to turn a 1 ms all-reduce into a
negative wait. A matched all_reduce, all_gather or barrier (the wire op: gloo's reduce-scatter
is an all_reduce) ends, up to transfer jitter, at the same moment on every member: no member
can finish before the last contribution has arrived, and the last ring step delivers to all of
them within one chunk time. So, with r_ref the lowest traced rank:

    d(a, b)   = median over matched calls holding a and b of (end_b - end_a)
    offset_b  = offset_a + d(a, b), grown from offset_ref = 0 along the pairs with most calls
    residual  = median |end_b - end_ref - offset_b|  (the jitter left, per rank)

When host names are known, a host has one clock: each host's offset is the median of its
ranks' estimates (the reference rank's host is exactly 0). Applying means every event of rank
r moves by -offset_r (and its flight-recorder entry times with it, which share its clock).
Applied when the traces come from different hosts (``host_name``), or when asked
(``analyze(..., align_clocks=True)``); ``align_clocks=False`` only reports.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import polars as pl

END_TOGETHER = ("all_reduce", "all_gather", "barrier")
METHOD = "median end offset of matched all_reduce/all_gather/barrier calls"


def _pairwise(ends: pl.DataFrame) -> dict[tuple[int, int], list[int]]:
    """(a, b) -> [end_b - end_a per call holding both], a < b."""
    out: dict[tuple[int, int], list[int]] = {}
    # calls in a defined order (the diffs' order does not change a median, but the pairs' order
    # decides ties below: it must not follow polars' thread scheduling)
    for _, part in ends.sort("call_id", "rank").group_by("call_id", maintain_order=True):
        got = dict(zip(part["rank"].to_list(), part["end_ns"].to_list()))
        rs = sorted(got)
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                out.setdefault((a, b), []).append(got[b] - got[a])
    return out


def estimate(table: pl.DataFrame, hosts: dict[int, str | None] | None = None) -> dict[str, Any]:
    """Offsets from a matched raw collectives table (tracekit.analyses.collectives.raw_collectives)."""
    hosts = hosts or {}
    ranks = sorted(int(r) for r in table["rank"].unique().to_list()) if table.height else []
    out: dict[str, Any] = {
        "method": METHOD,
        "reference_rank": ranks[0] if ranks else None,
        "offsets_ns": {},
        "residual_ns": {},
        "calls": {},
        "per_host": {},
        "applied": False,
    }
    if len(ranks) < 2 or "complete" not in table.columns:
        out["reason"] = "fewer than two ranks"
        return out
    ends = table.filter(pl.col("complete") & pl.col("wire_op").is_in(END_TOGETHER)).select(
        "call_id", "rank", "end_ns"
    )
    pairs = _pairwise(ends)
    ref = ranks[0]
    offsets: dict[int, float] = {ref: 0.0}
    # grow a spanning tree from the reference, best-supported pairs first; ties go to the
    # lowest (a, b), so the tree (and every offset along it) is the same on every run
    while True:
        edges = [
            (-len(d), ab) for ab, d in pairs.items() if (ab[0] in offsets) != (ab[1] in offsets)
        ]
        if not edges:
            break
        best = min(edges)[1]
        a, b = best
        d = statistics.median(pairs[best])
        if a in offsets:
            offsets[b] = offsets[a] + d
        else:
            offsets[a] = offsets[b] - d
    missing = [r for r in ranks if r not in offsets]
    # one clock per host: the median of its ranks' estimates
    by_host: dict[str, list[float]] = {}
    for r, off in offsets.items():
        if hosts.get(r):
            by_host.setdefault(str(hosts[r]), []).append(off)
    per_host = {h: statistics.median(v) for h, v in by_host.items()}
    if hosts.get(ref) and str(hosts[ref]) in per_host:
        base = per_host[str(hosts[ref])]
        per_host = {h: v - base for h, v in per_host.items()}
    final = {
        r: (per_host[str(hosts[r])] if hosts.get(r) and str(hosts[r]) in per_host else off)
        for r, off in offsets.items()
    }
    got = {
        r: dict(zip(p["call_id"].to_list(), p["end_ns"].to_list()))
        for (r,), p in ends.group_by("rank")
    }
    for r in ranks:
        if r == ref or r not in final:
            continue
        diffs = [
            got[r][c] - e - final[r] for c, e in got.get(ref, {}).items() if c in got.get(r, {})
        ]
        out["residual_ns"][str(r)] = (
            int(statistics.median(abs(d) for d in diffs)) if diffs else None
        )
        out["calls"][str(r)] = len(diffs)
    out["offsets_ns"] = {str(r): int(round(v)) for r, v in sorted(final.items())}
    out["per_host"] = {h: int(round(v)) for h, v in sorted(per_host.items())}
    if missing:
        out["reason"] = (
            f"ranks {missing} share no matched end-synchronous call with the others: not aligned"
        )
    return out


def _shift_records(sources: Any, offsets: dict[int, int]) -> Any:
    """The flight-recorder entries of each rank moved with its trace (same host clock)."""
    records = []
    for rec in sources.records:
        off = offsets.get(int(rec.rank), 0)
        if off:
            rec = dataclasses.replace(
                rec,
                entries=rec.entries.with_columns(
                    (pl.col("time_created_ns") - off).alias("time_created_ns")
                ),
            )
        records.append(rec)
    return dataclasses.replace(sources, records=tuple(records))


def align(
    events: pl.DataFrame,
    infos: Sequence[Any],
    sources: Any,
    table: pl.DataFrame,
    mode: bool | None = None,
) -> tuple[pl.DataFrame, Any, dict[str, Any] | None, list[str]]:
    """(events, sources, summary ``clock``, warnings): offsets estimated from ``table`` (the raw
    collectives of these events, tracekit.analyses.collectives.raw_collectives) and, when the
    traces come from several hosts (mode None) or when mode is True, applied (summary
    ``applied``: the events' times moved; the calls matched on them move with them)."""
    hosts = {int(i.rank): i.host_name for i in infos}
    if len(hosts) < 2:
        return events, sources, None, []
    several_hosts = len({h for h in hosts.values() if h}) > 1
    apply = mode is True or (mode is None and several_hosts)
    est = estimate(table, hosts if several_hosts else None)
    warnings = []
    if not est["offsets_ns"] or len(est["offsets_ns"]) < 2:
        if several_hosts:
            warnings.append(
                "clock: traces from several hosts, but no matched all_reduce/all_gather/barrier to "
                "align them: times are taken as given"
            )
        est["reason"] = est.get("reason") or "no matched end-synchronous collectives"
        return events, sources, est, warnings
    if est.get("reason") and apply:
        warnings.append(f"clock: {est['reason']}")
    if not apply:
        est["reason"] = (
            "all traces from one host: one clock, offsets only reported"
            if not several_hosts
            else "not asked"
        )
        return events, sources, est, warnings
    offsets = {int(r): v for r, v in est["offsets_ns"].items() if v}
    if offsets:
        events = shifted(events, offsets)
        sources = _shift_records(sources, offsets)
    est["applied"] = True
    return events, sources, est, warnings


Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


def shifted(
    events: Frame, offsets: Mapping[int, int], columns: Sequence[str] = ("start_ns", "end_ns")
) -> Frame:
    """EVENTS with each rank's times (COLUMNS) moved back by its offset (ns; ranks not in
    OFFSETS stay): the one shift :func:`align` applies, also to a rank's events read later on
    their own and to the calls matched before it moved them (tracekit.analyses.prepare)."""
    moving = {r: off for r, off in offsets.items() if off}
    if not moving:
        return events
    shift = pl.col("rank").cast(pl.Int64).replace_strict(moving, default=0, return_dtype=pl.Int64)
    return events.with_columns(pl.col(c) - shift for c in columns)


def applied_offsets(summary: dict[str, Any] | None) -> dict[int, int]:
    """rank -> the offset (ns) :func:`align` subtracted from its times; empty when it moved none."""
    if not summary or not summary.get("applied"):
        return {}
    return {int(r): int(v) for r, v in summary.get("offsets_ns", {}).items() if v}
