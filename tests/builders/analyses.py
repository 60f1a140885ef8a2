"""Events tables and synthetic Analysis objects for the timeline, figure, report and app tests.

``event_frame``: an events table from rows that give only the columns a test needs.

``synthetic_analysis``: a 4-rank, 2-node GPipe run with every summary section and frame the
analyses produce (pipeline, overlap, memory, traffic, collectives), so that each figure, report
table and app page is exercised without a real pipeline/ZeRO run; its texts carry an XSS
payload. ``big_analysis`` / ``big_timeline``: 64 ranks and 1,000,000 events for the speed checks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tracekit.analysis import Analysis
from tracekit.events import EVENT_SCHEMA
from tracekit.figures.style import STATES
from tracekit.ingest.spill import EventsRef
from tracekit.summary import to_struct

from .summary import complete
from .traces import XSS

T0 = 1_700_000_000_000_000_000


def event_frame(rows: list[dict]) -> pl.DataFrame:
    """An events table (tracekit.events.EVENT_SCHEMA) of rows that give some columns (the
    others null)."""
    full = [{**{k: None for k in EVENT_SCHEMA}, **r} for r in rows]
    return pl.DataFrame(full, schema=EVENT_SCHEMA)


def _on_main(rank: int, cat: str, name: str, start_ns: int, end_ns: int, kind: str, **more):
    """A row of an event on the main thread of a CPU rank."""
    return {
        "rank": rank,
        "device": "cpu",
        "pid": "1",
        "tid": "1",
        "thread_name": "main",
        "cat": cat,
        "name": name,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "kind": kind,
        **more,
    }


def _timeline_from(
    ops: list[tuple[int, int, int, str]], lo: int, hi: int, ranks: list[int]
) -> pl.DataFrame:
    """States from non-overlapping (rank, start, end, state) spans; gaps are idle."""
    rows = []
    for r in ranks:
        t = lo
        for _rank, s, e, state in sorted(o for o in ops if o[0] == r):
            if s > t:
                rows.append((r, t, s, "idle"))
            rows.append((r, s, e, state))
            t = e
        if t < hi:
            rows.append((r, t, hi, "idle"))
    return pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "state": pl.Utf8},
        orient="row",
    )


def synthetic_analysis(name: str = "synthetic-gpipe") -> Analysis:
    """4 ranks = 4 pipeline stages on 2 nodes, GPipe with m=4, one step; every section filled."""
    p, m = 4, 4
    f_ns, b_ns, hop = 1_000_000, 2_000_000, 100_000
    ops, replay, states, events = [], [], [], []
    for s in range(p):
        for j in range(m):  # GPipe: all forwards, then all backwards
            start = T0 + (s + j) * (f_ns + hop)
            ops.append(
                {
                    "rank": s,
                    "stage": s,
                    "step": 1,
                    "kind": "F",
                    "microbatch": j,
                    "version": None,
                    "start_ns": start,
                    "end_ns": start + f_ns,
                }
            )
            replay.append(
                {
                    "stage": s,
                    "kind": "F",
                    "microbatch": j,
                    "start_s": (s + j) * f_ns * 1e-9,
                    "end_s": (s + j + 1) * f_ns * 1e-9,
                }
            )
        fwd_end = T0 + (p - 1 + m) * (f_ns + hop)
        for j in range(m):
            start = fwd_end + ((p - 1 - s) + j) * (b_ns + hop)
            ops.append(
                {
                    "rank": s,
                    "stage": s,
                    "step": 1,
                    "kind": "B",
                    "microbatch": m - 1 - j,
                    "version": None,
                    "start_ns": start,
                    "end_ns": start + b_ns,
                }
            )
            replay.append(
                {
                    "stage": s,
                    "kind": "B",
                    "microbatch": m - 1 - j,
                    "start_s": (p + m - 1) * f_ns * 1e-9 + ((p - 1 - s) + j) * b_ns * 1e-9,
                    "end_s": (p + m - 1) * f_ns * 1e-9 + ((p - 1 - s) + j + 1) * b_ns * 1e-9,
                }
            )
    ops_df = pl.DataFrame(
        ops,
        schema={
            "rank": pl.Int32,
            "stage": pl.Int32,
            "step": pl.Int32,
            "kind": pl.Utf8,
            "microbatch": pl.Int32,
            "version": pl.Int32,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
    )
    lo = T0
    hi = int(ops_df["end_ns"].max()) + 500_000
    bubbles = []
    for s in range(p):
        mine = ops_df.filter(pl.col("stage") == s).sort("start_ns")
        first, last = int(mine["start_ns"].min()), int(mine["end_ns"].max())
        bubbles.append(
            {"rank": s, "stage": s, "step": 1, "phase": "fill", "start_ns": lo, "end_ns": first}
        )
        prev = None
        for row in mine.iter_rows(named=True):
            if prev is not None and row["start_ns"] > prev:
                bubbles.append(
                    {
                        "rank": s,
                        "stage": s,
                        "step": 1,
                        "phase": "steady",
                        "start_ns": prev,
                        "end_ns": row["start_ns"],
                    }
                )
            prev = row["end_ns"]
        bwd_end = T0 + (p - 1 + m) * (f_ns + hop) + (p - 1 + m) * (b_ns + hop)
        if last < bwd_end:
            bubbles.append(
                {
                    "rank": s,
                    "stage": s,
                    "step": 1,
                    "phase": "drain",
                    "start_ns": last,
                    "end_ns": bwd_end,
                }
            )
    bubbles_df = pl.DataFrame(
        bubbles,
        schema={
            "rank": pl.Int32,
            "stage": pl.Int32,
            "step": pl.Int32,
            "phase": pl.Utf8,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
    )
    for o in ops:
        # forward/backward compute, a send right after it (exposed), a little overlap in backward
        states.append((o["rank"], o["start_ns"], o["end_ns"] - 50_000, "compute"))
        states.append((o["rank"], o["end_ns"] - 50_000, o["end_ns"], "overlap"))
        states.append((o["rank"], o["end_ns"], o["end_ns"] + 60_000, "comm"))
        states.append((o["rank"], o["end_ns"] + 60_000, o["end_ns"] + 70_000, "other"))
        op_name = f"{'forward' if o['kind'] == 'F' else 'backward'} mb{o['microbatch']}"
        events.append(_on_main(o["rank"], "cpu_op", op_name, o["start_ns"], o["end_ns"], "compute"))
        events.append(
            _on_main(
                o["rank"],
                "user_annotation",
                "gloo:send",
                o["end_ns"] - 50_000,
                o["end_ns"] + 60_000,
                "communication",
                op="send",
                bytes=4 * 1024 * 1024,
                peer=(o["rank"] + 1) % p,
            )
        )
    events.append(_on_main(0, "cpu_op", XSS, T0 + 10, T0 + 20_000, "compute"))
    events.append(_on_main(0, "user_annotation", "ProfilerStep#1", lo, hi, "annotation"))
    tl = _timeline_from(states, lo, hi, list(range(p)))
    ranks = []
    for r in range(p):
        t = tl.filter(pl.col("rank") == r).with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("d")
        )
        tot = {s: float(t.filter(pl.col("state") == s)["d"].sum()) * 1e-9 for s in STATES}
        ranks.append(
            {
                "rank": r,
                "node": r // 2,
                "span_s": (hi - lo) * 1e-9,
                "step_time_s": (hi - lo) * 1e-9,
                "compute_s": tot["compute"] + tot["overlap"],
                "comm_s": tot["overlap"] + tot["comm"],
                "overlap_s": tot["overlap"],
                "exposed_comm_s": tot["comm"],
                "other_s": tot["other"],
                "idle_s": tot["idle"],
            }
        )
    per_layer = []
    for u in range(4):
        for phase, op in (("fwd", "all_gather"), ("bwd", "all_gather"), ("bwd", "reduce_scatter")):
            d = 0.002 + 0.001 * u
            hidden = d * (0.9 if phase == "fwd" else 0.5)
            per_layer.append(
                {
                    "unit": f"layers.{u}",
                    "phase": phase,
                    "op": op,
                    "duration_s": d,
                    "hidden_s": hidden,
                    "exposed_s": d - hidden,
                }
            )
    units = pl.DataFrame(
        [
            {
                **row,
                "rank": r,
                "start_ns": T0 + i * 3_000_000,
                "end_ns": T0 + i * 3_000_000 + 2_000_000,
            }
            for r in range(p)
            for i, row in enumerate(per_layer)
        ]
    )
    nodes = {str(r): r // 2 for r in range(p)}
    matrix = [[0] * p for _ in range(p)]
    for r in range(p):
        matrix[r][(r + 1) % p] = (
            3 * 4 * 1024 * 1024 if (r // 2) == (((r + 1) % p) // 2) else 8 * 1024 * 1024
        )
    intra = sum(matrix[r][c] for r in range(p) for c in range(p) if r // 2 == c // 2)
    inter = sum(matrix[r][c] for r in range(p) for c in range(p) if r // 2 != c // 2)
    mib = 2**20
    summary = {
        "schema_version": 1,
        "source": name,
        "warnings": [f"a synthetic run; this warning names {XSS}"],
        "window": {"kind": "complete_steps", "steps": 1, "start_ns": lo, "end_ns": hi},
        "topology": {"source": "run.json", "nodes": nodes},
        "run": {
            "strategy": "pp-gpipe",
            "world_size": p,
            "backend": "gloo",
            "device": "cpu",
            "precision": "fp32",
            "status": "ok",
        },
        "ranks": ranks,
        "collectives": {
            "count": 32,
            "bytes": 32 * 4 * mib,
            "ideal_bytes_per_rank": 8 * 4 * mib,
            "per_op": [
                {
                    "op": "send",
                    "count": 16,
                    "bytes": 16 * 4 * mib,
                    "transfer_s": 0.0008,
                    "wait_s": 0.0002,
                    "time_s": 0.001,
                    "algbw_gbps": 1.2,
                    "busbw_gbps": 1.2,
                },
                {
                    "op": "all_reduce",
                    "count": 16,
                    "bytes": 16 * 4 * mib,
                    "transfer_s": None,
                    "wait_s": None,
                    "time_s": 0.002,
                    "algbw_gbps": 0.9,
                    "busbw_gbps": 1.35,
                },
            ],
            "per_group": [
                {"group": "0", "label": "group 0", "op": "all_reduce", "busbw_gbps": 1.35},
                {"group": "1", "label": "group 1", "op": "send", "busbw_gbps": 1.2},
            ],
        },
        "memory": {
            "per_rank": [
                {
                    "rank": r,
                    "params_bytes": 4 * mib,
                    "grads_bytes": 4 * mib,
                    "optimizer_bytes": 8 * mib,
                    "model_states_bytes": 16 * mib,
                    "activation_peak_bytes": (4 - r) * mib,
                    "peak_bytes": 16 * mib + (4 - r) * mib,
                }
                for r in range(p)
            ],
            "theory": {"model_states_bytes": 16 * mib, "formula": "16Psi (DP, fp32)"},
        },
        "pipeline": {
            "schedule": "gpipe",
            "stages": p,
            "microbatches": m,
            "bubble_fraction": 0.45,
            "bubble_fraction_span": 0.5,
            "bubble_fraction_theory": (p - 1) / (m + p - 1),
            "bubble_fraction_replay": 0.43,
            "per_stage": [
                {
                    "stage": s,
                    "fill_s": s * 0.0011,
                    "steady_s": 0.0004,
                    "drain_s": (p - 1 - s) * 0.0021,
                    "max_inflight_microbatches": m,
                    "activation_peak_bytes": (4 - s) * mib,
                    "weight_versions": None,
                }
                for s in range(p)
            ],
        },
        "overlap": {
            "allgather_s": sum(r["duration_s"] for r in per_layer if r["op"] == "all_gather"),
            "allgather_hidden_fraction": 0.7,
            "reducescatter_s": sum(
                r["duration_s"] for r in per_layer if r["op"] == "reduce_scatter"
            ),
            "reducescatter_hidden_fraction": 0.5,
            "per_layer": per_layer,
        },
        "traffic": {
            "model": {"send": "p2p", "all_reduce": "ring"},
            "intra_node_bytes": intra,
            "inter_node_bytes": inter,
            "inter_node_fraction": inter / (intra + inter),
            "total_bytes": intra + inter,
            "by_op": [
                {"op": "send", "intra": intra, "inter": inter // 2, "bytes": intra + inter // 2},
                {
                    "op": "all_reduce",
                    "intra": 0,
                    "inter": inter - inter // 2,
                    "bytes": inter - inter // 2,
                },
            ],
            "by_group": [
                {
                    "group": "0",
                    "label": "group 0",
                    "op": "all_reduce",
                    "intra": 0,
                    "inter": inter - inter // 2,
                    "bytes": inter - inter // 2,
                }
            ],
            "matrix": matrix,
        },
        # two of the four stages shared a core with another: 30 % and 5 % of their steps
        "contention": {
            "ranks": p,
            "machine_cores": 2,
            "local_ranks": p,
            "cpu_wait_share_max": 0.3,
            "inflated": [0],
            "per_rank": [
                {"rank": r, "wall_s": 1.0, "cpu_wait_s": w, "cpu_wait_share": w, "pinned": False}
                for r, w in enumerate([0.3, 0.05, 0.0, 0.0])
            ],
        },
    }
    return Analysis(
        path=Path(name),
        summary=to_struct(complete(summary)),  # the keys no figure draws: null, 0 or empty
        events_at=by_rank(event_frame(events)),
        timeline_at=by_rank(tl),
        frames={
            "ranks": pl.DataFrame(ranks),
            "pipeline_ops": ops_df,
            "bubbles": bubbles_df,
            "pipeline_replay": pl.DataFrame(replay),
            "overlap_units": units,
        },
    )


def big_timeline(
    ranks: int = 64, n: int = 1_000_000, seed: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """n events on `ranks` ranks (back to back with gaps) and the timeline they make (~1.5 n spans)."""
    rng = np.random.default_rng(seed)
    per = n // ranks
    dur = rng.integers(2_000, 40_000, size=(ranks, per))
    gap = np.where(rng.random((ranks, per)) < 0.5, rng.integers(500, 20_000, size=(ranks, per)), 0)
    ends = np.cumsum(dur + gap, axis=1)
    starts = ends - dur
    kinds = np.where(rng.random((ranks, per)) < 0.75, "compute", "communication")
    rank = np.repeat(np.arange(ranks, dtype=np.int32), per)
    names = np.where(kinds == "compute", "aten::mm", "gloo:all_reduce")
    is_comp = (kinds == "compute").ravel()
    ev = pl.DataFrame(
        {
            "rank": rank,
            "device": "cpu",
            "pid": "1",
            "tid": "1",
            "thread_name": "main",
            "cat": np.where(is_comp, "cpu_op", "user_annotation"),
            "name": names.ravel(),
            "start_ns": starts.ravel() + T0,
            "end_ns": ends.ravel() + T0,
            "kind": kinds.ravel(),
        }
    ).with_columns(
        pl.when(pl.col("kind") == "compute").then(None).otherwise(pl.lit("all_reduce")).alias("op"),
        pl.when(pl.col("kind") == "compute")
        .then(None)
        .otherwise(pl.lit(1 << 20, pl.Int64))
        .alias("bytes"),
    )
    ev = pl.concat([event_frame([]), ev], how="diagonal_relaxed").select(list(EVENT_SCHEMA))
    busy = ev.select(
        "rank",
        "start_ns",
        "end_ns",
        pl.when(pl.col("kind") == "compute")
        .then(pl.lit("compute"))
        .otherwise(pl.lit("comm"))
        .alias("state"),
    )
    idle = (
        busy.with_columns(
            pl.col("end_ns").alias("s"), pl.col("start_ns").shift(-1).over("rank").alias("e")
        )
        .filter(pl.col("e").is_not_null() & (pl.col("e") > pl.col("s")))
        .select(
            "rank",
            pl.col("s").alias("start_ns"),
            pl.col("e").alias("end_ns"),
            pl.lit("idle").alias("state"),
        )
    )
    tl = pl.concat([busy, idle]).sort("rank", "start_ns")
    return ev, tl


def big_analysis(ranks: int = 64, n: int = 1_000_000) -> Analysis:
    ev, tl = big_timeline(ranks, n)
    summary = {
        "schema_version": 1,
        "warnings": [],
        "window": {"kind": "whole_trace", "steps": 0},
        "ranks": [{"rank": r, "node": r // 8, "span_s": 1.0} for r in range(ranks)],
        "memory": None,
        "pipeline": None,
        "overlap": None,
        "traffic": None,
        "topology": {"nodes": {str(r): r // 8 for r in range(ranks)}},
    }
    return Analysis(
        path=Path(f"synthetic-{ranks}x{n}"),
        summary=to_struct(complete(summary)),
        events_at=by_rank(ev),
        timeline_at=by_rank(tl),
        frames={"ranks": pl.DataFrame(summary["ranks"])},
    )


def by_rank(frame: pl.DataFrame) -> dict[int, EventsRef]:
    """FRAME's rows of each rank, held in memory, as an Analysis keeps them (tracekit.ingest.spill)."""
    if frame.height == 0:
        return {}
    parts = frame.partition_by("rank", as_dict=True, maintain_order=True)
    return {int(r): EventsRef(frame=part) for (r,), part in sorted(parts.items())}
