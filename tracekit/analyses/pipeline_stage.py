"""Per pipeline stage: microbatches in flight, weight versions, and time blocked in recv.

- in-flight microbatches of a stage: forwards started whose backward has not ended (F and B of a
  microbatch paired in order; a backward whose forward came before the trace counts from the
  start). weight_versions (PipeDream): most distinct versions among in-flight microbatches.
- recv split: every receive is matched to its send on the peer (per (src, dst) pair, by
  microbatch where the label names it, else in order). transfer = the part of the receive after
  the send started; the rest is waiting for the upstream (or downstream) stage.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Set
from typing import Any, cast

import polars as pl

from tracekit import labels
from tracekit.ingest.run_record import MemoryCounts

NS = 1e-9


def _pairs(ops: pl.DataFrame) -> list[tuple[int | None, int | None, int | None]]:
    """(F start, B end, version) of every microbatch of one stage: n-th F with n-th B of a mb."""
    fs, bs = defaultdict(list), defaultdict(list)
    for kind, mb, v, s, e in (
        ops.sort("start_ns")
        .select("kind", "microbatch", "version", "start_ns", "end_ns")
        .iter_rows()
    ):
        if kind == "F":
            fs[mb].append((s, v))
        elif kind == "B":
            bs[mb].append((e, v))
    out: list[tuple[int | None, int | None, int | None]] = []
    for mb in set(fs) | set(bs):
        f, b = fs.get(mb, []), bs.get(mb, [])
        lead = 0
        if b and (not f or b[0][0] < f[0][0]):
            lead = 1  # its forward ran before the trace began
            out.append((None, b[0][0], b[0][1]))
        for i, (s, v) in enumerate(f):
            j = i + lead
            out.append(
                (
                    s,
                    b[j][0] if j < len(b) else None,
                    v if v is not None else (b[j][1] if j < len(b) else None),
                )
            )
    return out


def inflight_and_versions(ops: pl.DataFrame) -> tuple[int, int | None]:
    """Max in-flight microbatches of one stage, and the most distinct weight versions in flight."""
    events = []
    for k, (s, e, v) in enumerate(_pairs(ops)):
        events.append((s if s is not None else -1, 1, k, v))
        if e is not None:
            events.append(
                (e, 0, k, v)
            )  # at equal times a backward's end frees before a forward adds
    live: dict[int, int | None] = {}
    peak, versions = 0, None
    for _t, add, k, v in sorted(events):
        if add:
            live[k] = v
        else:
            live.pop(k, None)
        peak = max(peak, len(live))
        vs = {x for x in live.values() if x is not None}
        if vs:
            versions = max(versions or 0, len(vs))
    return peak, versions


def recv_split(
    events: pl.DataFrame,
    stage_of_rank: dict[int, int],
    collectives: pl.DataFrame,
    blocking: Set[tuple[int, int]],
) -> tuple[dict[int, dict[str, float]], str]:
    """Per rank: seconds blocked in recv split into transfer and waiting for the peer.
    BLOCKING: (rank, start_ns) of the receives that block (pipeline_ops.blocking_comm)."""
    ann = events.filter(
        (pl.col("device") == "cpu")
        & pl.col("name").str.starts_with("comm:")
        & pl.col("name").str.contains(r"^comm:(send|recv):")
    ).select("rank", "name", "start_ns", "end_ns")
    rows = []
    for r, name, s, e in ann.iter_rows():
        lab = labels.parse(name)
        if lab is not None and lab.peer is not None:
            rows.append((r, lab.op, lab.what, lab.microbatch, lab.peer, s, e, True))
    method = "labels"
    if not rows and collectives.height:
        # no tracekit labels: the gloo/nccl p2p spans, matched in order; only receives that
        # block (no compute inside the span) count as time blocked in recv
        method = "p2p spans in order (blocking receives only)"
        p2p = collectives.filter(
            pl.col("op").is_in(["send", "recv"]) & pl.col("peer").is_not_null()
        )
        rows = [
            (r, op, None, None, peer, s, e, (r, s) in blocking)
            for r, op, peer, s, e in p2p.select(
                "rank", "op", "peer", "start_ns", "end_ns"
            ).iter_rows()
        ]
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, op, what, mb, peer, s, e, counted in sorted(rows, key=lambda x: x[5]):
        if op == "send":
            sends[(r, peer, what, mb)].append(s)
        else:
            recvs[(peer, r, what, mb)].append((s, e, counted))
    out = {
        r: {"recv_s": 0.0, "recv_transfer_s": 0.0, "recv_wait_s": 0.0, "recv_unmatched_s": 0.0}
        for r in stage_of_rank
    }
    for key, rs in recvs.items():
        ss = sends.get(key, [])
        # receives that ended before the pair's first traced send had their send before the trace
        offset = -sum(1 for _, e, _ in rs if ss and e <= ss[0]) if ss else -len(rs)
        for i, (s, e, counted) in enumerate(rs):
            if not counted:
                continue
            d = out.setdefault(
                key[1],
                {
                    "recv_s": 0.0,
                    "recv_transfer_s": 0.0,
                    "recv_wait_s": 0.0,
                    "recv_unmatched_s": 0.0,
                },
            )
            d["recv_s"] += (e - s) * NS
            j = i + offset
            if 0 <= j < len(ss):
                transfer = max(0, e - max(s, ss[j]))
                d["recv_transfer_s"] += transfer * NS
                d["recv_wait_s"] += (e - s - transfer) * NS
            else:
                d["recv_unmatched_s"] += (e - s) * NS
    return out, method


def stage_rows(
    ops: pl.DataFrame,
    stage_of_rank: dict[int, int],
    per: Mapping[int, Mapping[str, float]],
    span: int,
    span_busy: Mapping[int, int],
    recv: Mapping[int, Mapping[str, float]],
    memory: Mapping[int, MemoryCounts],
) -> list[dict[str, Any]]:
    """summary ``pipeline.per_stage``: one row per pipeline rank, in stage order. ``per``: the
    rank's busy, window, fill, steady and drain ns (tracekit.analyses.pipeline_bubble);
    ``memory``: the ranks' memory/rank<R>.json counts (activations)."""
    rows: list[dict[str, Any]] = []
    for r in sorted(stage_of_rank):
        mine = ops.filter(pl.col("rank") == r)
        by_stage = [
            inflight_and_versions(mine.filter(pl.col("stage") == s))
            for s in sorted(mine["stage"].unique().to_list())
        ]
        stale = mine.filter(pl.col("kind") == "B")["staleness"].drop_nulls()
        mem = memory.get(r) or MemoryCounts()
        rs = recv.get(r, {})
        pr = per[r]
        rows.append(
            {
                "stage": stage_of_rank[r],
                "rank": r,
                "stages_on_rank": sorted(mine["stage"].unique().to_list()),
                "fill_s": pr["fill"] * NS,
                "steady_s": pr["steady"] * NS,
                "drain_s": pr["drain"] * NS,
                "busy_s": pr["busy"] * NS,
                "window_s": pr["window"] * NS,
                "bubble_fraction": (1 - pr["busy"] / pr["window"]) if pr["window"] else None,
                "bubble_fraction_span": (1 - span_busy[r] / span) if span > 0 else None,
                "max_inflight_microbatches": max(x[0] for x in by_stage),
                "activation_peak_bytes": mem.activation_peak_bytes,
                "activation_bytes_per_microbatch": mem.activation_bytes_per_microbatch,
                "weight_versions": max((x[1] for x in by_stage if x[1] is not None), default=None),
                "staleness_max": int(cast(int, stale.max())) if stale.len() else None,
                "staleness_mean": float(cast(float, stale.mean())) if stale.len() else None,
                "recv_s": rs.get("recv_s", 0.0),
                "recv_wait_s": rs.get("recv_wait_s", 0.0),
                "recv_transfer_s": rs.get("recv_transfer_s", 0.0),
                "recv_unmatched_s": rs.get("recv_unmatched_s", 0.0),
            }
        )
    rows.sort(key=lambda x: x["stage"])
    return rows
