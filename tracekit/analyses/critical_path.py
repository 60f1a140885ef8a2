"""The critical path of each step across ranks (Böhme et al., IPDPS 2012), docs/metrics.md "Why".

Walk back from the step's last end (the rank whose step marker ends last) to its start: on the
current rank, the latest complete call ending before the current time is a synchronisation;
the path holds the rank's own time from that call's end up to now, then the call's transfer
(from its last arrival to its end) and moves to the rank that arrived last, at its arrival (it
stays on the rank when that rank was last itself). It stops at the step's start on the rank
it is on. Every piece is one rank's time, so the path's length is the step's span, shared per
rank and, through the timeline (tracekit.analyses.wait_states.state_sets), per state; the ops
on it are the top-level ops inside its pieces. One rank: the path is that rank's step.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracekit.analyses import intervals as iv
from tracekit.analyses.root_causes import Ops, Sets

#: the frame ``critical_path``: its pieces, step by step
PATH_SCHEMA = {
    "step": pl.Int32,
    "rank": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "piece": pl.Utf8,
    "call_id": pl.Utf8,
}


def steps_of(markers: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """One row per step and rank: step, rank, start_ns, end_ns (the window when no markers)."""
    m = (
        markers.join(windows.select("rank", "steps", "kind"), on="rank")
        .filter(pl.col("kind") == "complete_steps")
        .sort("rank", "start_ns")
        .with_columns(pl.int_range(pl.len()).over("rank").alias("step"))
        .filter(pl.col("step") < windows["steps"].min())
    )
    if m.height == 0:
        return windows.select(pl.lit(0, pl.Int32).alias("step"), "rank", "start_ns", "end_ns")
    return m.select(pl.col("step").cast(pl.Int32), "rank", "start_ns", "end_ns")


def walk(steps: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """``critical_path``: the pieces of each step's path."""
    calls: dict[int, pl.DataFrame] = {
        int(r): part.sort("done_ns")
        for (r,), part in waits.filter("sync").partition_by("rank", as_dict=True).items()
    }
    arrays = {
        r: (
            p["done_ns"].to_numpy(),
            p["start_ns"].to_numpy(),
            p["last_arrival_ns"].to_numpy(),
            p["last_rank"].to_numpy(),
            p["call_id"].to_list(),
        )
        for r, p in calls.items()
    }
    rows: list[tuple[int, int, int, int, str, str | None]] = []
    for (step,), part in steps.partition_by("step", as_dict=True, maintain_order=True).items():
        begin = dict(zip(part["rank"].to_list(), part["start_ns"].to_list(), strict=True))
        last = part.sort("end_ns", "rank", descending=[True, False]).row(0, named=True)
        r, t = int(last["rank"]), int(last["end_ns"])
        # each hop goes strictly back in time (calls ending before t): a path has at most one
        # hop per call; the bound only guards against a trace whose calls overlap oddly
        for _ in range(2 * waits.height + 2):
            s0 = begin.get(r, t)
            ends, starts, arr, who, ids = arrays.get(r, (np.array([], np.int64),) * 4 + ([],))
            k = int(np.searchsorted(ends, t, side="left")) - 1  # done < t
            if k < 0 or ends[k] <= s0:
                rows.append((step, r, min(s0, t), t, "work", None))
                break
            end, la = int(ends[k]), int(arr[k])
            rows.append((step, r, end, t, "work", None))
            la = max(min(la, end), s0)
            rows.append((step, r, la, end, "transfer", ids[k]))
            d = int(who[k])
            if d == r or d not in begin:
                t = max(min(int(starts[k]), la), s0)
            else:
                r, t = d, la
            if t <= begin.get(r, t):
                rows.append((step, r, begin.get(r, t), t, "work", None))
                break
    return pl.DataFrame(rows, schema=PATH_SCHEMA, orient="row").filter(
        pl.col("end_ns") > pl.col("start_ns")
    )


def shares(
    path: pl.DataFrame, sets: dict[int, Sets], ops: dict[int, Ops]
) -> tuple[dict[int, int], dict[str, int], list[tuple[int, str, int]]]:
    """ns on the path per rank, per state (compute, transfer, waiting, other, idle) and the top
    ops on it: (rank, name, ns), most first."""
    per_rank: dict[int, int] = {}
    per_state: dict[str, int] = {s: 0 for s in ("compute", "transfer", "waiting", "other", "idle")}
    top: list[tuple[int, str, int]] = []
    for (r,), p in path.partition_by("rank", as_dict=True).items():
        r = int(r)
        a, b = iv.union(p["start_ns"].to_numpy(), p["end_ns"].to_numpy())
        per_rank[r] = int((b - a).sum())
        if r in sets:
            s = sets[r]
            inside = {
                k: int(iv.intersect((a, b), s[k])[1].sum() - iv.intersect((a, b), s[k])[0].sum())
                for k in ("compute", "comm", "waiting", "other", "idle")
            }
            per_state["compute"] += inside["compute"]
            per_state["transfer"] += inside["comm"] - inside["waiting"]
            per_state["waiting"] += inside["waiting"]
            per_state["other"] += inside["other"]
            per_state["idle"] += inside["idle"]
        if r in ops:
            o = ops[r]
            on = iv.inside(a, b, o.starts, o.ends)
            sums = np.bincount(o.codes, weights=on, minlength=len(o.names))
            top += [(r, o.names[k], int(sums[k])) for k in np.flatnonzero(sums)]
    top.sort(key=lambda x: (-x[2], x[0], x[1]))
    return per_rank, per_state, top
