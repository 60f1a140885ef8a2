"""Replay a pipeline schedule with free communication: what the schedule alone costs.

p stages, m microbatches, F(s, j) / B(s, j) the forward / backward of microbatch j on stage s,
with given durations f[s][j], b[s][j]. Communication is free (zero transfer time) but its
dependencies hold:

    F(s, j) starts after F(s-1, j)                 (activations flow down the pipeline)
    B(s, j) starts after F(s, j) and B(s+1, j)     (gradients flow back up; the last stage
                                                    needs only its own forward)

and every stage runs its ops one at a time, strictly in its schedule order. Each op starts as
soon as both hold: start = max(stage free, dependencies done). Nothing else waits, so the
replay is the best this schedule can do with these compute times; a measured run's extra
idle is communication and noise, not the schedule.

Schedules: the per-stage op orders of tracekit.strategies.schedules (gpipe, 1f1b, pipedream),
the very lists the reference runs walk.

Window: from the first F start to the last B end. For gpipe and 1f1b with steps = 1 that is
the pipeline window of the step (docs/metrics.md "Pipeline"); for pipedream or steps > 1 it is the whole
span. bubble_fraction = sum over stages of (window - busy) / (p x window).

With uniform stages (f, b the same everywhere) GPipe and 1F1B both take (m+p-1)(f+b): the last
backward on stage 0 waits for p-1 forward hops and p-1 backward hops besides its own m(f+b).
So bubble = (p-1)/(m+p-1) of the step, whatever b/f is (GPipe arXiv:1811.06965; Megatron's
(p-1)/m is the same idle relative to the ideal time m(f+b)). 1F1B only lowers the in-flight
activations: min(p-r, m) microbatches on stage r instead of GPipe's m. PipeDream pays the
fill and drain once per run instead of once per step: (p-1)/(S m + p-1) over S steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import polars as pl

from tracekit.strategies import schedules

OPS_SCHEMA = {
    "stage": pl.Int64,
    "step": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "start": pl.Float64,
    "end": pl.Float64,
}
PER_STAGE_SCHEMA = {
    "stage": pl.Int64,
    "busy": pl.Float64,
    "fill": pl.Float64,
    "drain": pl.Float64,
    "steady": pl.Float64,
    "max_inflight": pl.Int64,
}

Durations = Sequence[Sequence[float]] | Sequence[float] | float


@dataclass
class ReplayResult:
    ops: pl.DataFrame  # stage, step, kind ("F"/"B"), microbatch, start, end
    makespan: float  # window length: first F start to last B end
    bubble_fraction: float  # idle of all stages inside the window / (p x window)
    per_stage: pl.DataFrame  # stage, busy, fill, drain, steady, max_inflight


def _durations(x: Durations, p: int, m: int, name: str) -> list[list[float]]:
    """[stage][microbatch] from a scalar, a per-stage list, or a [stage][microbatch] table."""
    if isinstance(x, (int, float)):
        return [[float(x)] * m for _ in range(p)]
    rows: list[Sequence[float] | float] = list(x)
    if len(rows) != p:
        raise ValueError(f"{name}: expected {p} stages, got {len(rows)}")
    table = []
    for s, row in enumerate(rows):
        if isinstance(row, (int, float)):
            table.append([float(row)] * m)
            continue
        values = [float(v) for v in row]
        if len(values) != m:
            raise ValueError(f"{name}[{s}]: expected {m} microbatches, got {len(values)}")
        table.append(values)
    if any(v < 0 for row in table for v in row):
        raise ValueError(f"{name}: durations must be >= 0")
    return table


def _dependencies(kind: str, stage: int, step: int, j: int, p: int) -> list[tuple]:
    if kind == "F":
        return [("F", stage - 1, step, j)] if stage > 0 else []
    deps = [("F", stage, step, j)]
    if stage < p - 1:
        deps.append(("B", stage + 1, step, j))
    return deps


def _max_inflight(program: list[tuple[str, int, int]]) -> int:
    """Most microbatches forwarded and not yet backwarded: the activations a stage holds."""
    inflight = peak = 0
    for kind, _, _ in program:
        inflight += 1 if kind == "F" else -1
        peak = max(peak, inflight)
    return peak


def replay(
    schedule: str,
    p: int,
    m: int,
    fwd: Durations,
    bwd: Durations,
    steps: int = 1,
    backward_order: str = "same",
) -> ReplayResult:
    """Discrete-event replay of `schedule` with free communication (see the module docstring)."""
    schedules.check(schedule, p, m)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    f, b = _durations(fwd, p, m, "fwd"), _durations(bwd, p, m, "bwd")
    programs = [schedules.stream(schedule, p, m, s, steps, backward_order) for s in range(p)]

    end: dict[tuple, float] = {}
    rows: list[dict] = []
    nxt, free = [0] * p, [0.0] * p
    remaining = sum(len(prog) for prog in programs)
    while remaining:
        progressed = False
        for s in range(p):
            # Run this stage's ops while their inputs are ready; stop at the first that waits.
            while nxt[s] < len(programs[s]):
                kind, step, j = programs[s][nxt[s]]
                deps = _dependencies(kind, s, step, j, p)
                if any(d not in end for d in deps):
                    break
                start = max([free[s]] + [end[d] for d in deps])
                stop = start + (f if kind == "F" else b)[s][j]
                end[(kind, s, step, j)] = free[s] = stop
                rows.append(
                    {
                        "stage": s,
                        "step": step,
                        "kind": kind,
                        "microbatch": j,
                        "start": start,
                        "end": stop,
                    }
                )
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for these schedules; guards a bad order
            raise RuntimeError(f"{schedule} replay deadlocked at {nxt}")

    ops = pl.DataFrame(rows, schema=OPS_SCHEMA).sort("stage", maintain_order=True)
    # Float64 columns of a non-empty frame: their min and max are floats
    lo = cast(float, ops.filter(pl.col("kind") == "F")["start"].min())
    hi = cast(float, ops.filter(pl.col("kind") == "B")["end"].max())
    window = hi - lo

    per_stage: list[dict[str, Any]] = []
    for s in range(p):
        mine = ops.filter(pl.col("stage") == s)
        starts, ends = mine["start"].to_list(), mine["end"].to_list()
        per_stage.append(
            {
                "stage": s,
                "busy": float(sum(e - st for st, e in zip(starts, ends))),
                "fill": cast(float, mine.filter(pl.col("kind") == "F")["start"].min()) - lo,
                "drain": hi - cast(float, mine.filter(pl.col("kind") == "B")["end"].max()),
                "steady": float(sum(max(0.0, st - e) for e, st in zip(ends[:-1], starts[1:]))),
                "max_inflight": _max_inflight(programs[s]),
            }
        )
    per_stage_df = pl.DataFrame(per_stage, schema=PER_STAGE_SCHEMA)
    idle = sum(window - r["busy"] for r in per_stage)
    bubble = idle / (p * window) if window > 0 else 0.0
    return ReplayResult(ops=ops, makespan=window, bubble_fraction=bubble, per_stage=per_stage_df)
