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

Schedules (per-stage op order for one step):

    gpipe      F0 F1 ... F(m-1), then B0 ... B(m-1)  (torch's ScheduleGPipe; backward_order=
               "reverse" gives B(m-1) ... B0 as in most other implementations)
    1f1b       PipeDream-Flush: warm-up w = min(p-r-1, m) forwards on stage r, then steady state
               "one forward, then the oldest backward", then cool-down backwards
    pipedream  asynchronous PipeDream: the 1F1B order with no flush, so the steps run back to
               back as ONE 1F1B stream of steps x m microbatches (warm-up once, cool-down once)

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

SCHEDULES = ("gpipe", "1f1b", "pipedream")
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


def _check(schedule: str, p: int, m: int, stage: int | None = None) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 stages and m >= 1 microbatches, got p={p}, m={m}")
    if stage is not None and not 0 <= stage < p:
        raise ValueError(f"stage {stage} outside 0..{p - 1}")


def _one_f_one_b(p: int, n: int, stage: int) -> list[tuple[str, int]]:
    """1F1B order of n microbatches on one stage."""
    warmup = min(p - stage - 1, n)  # enough forwards in flight to fill the stages below
    order = [("F", j) for j in range(warmup)]
    for i in range(n - warmup):  # steady state: one forward, then the oldest backward
        order += [("F", warmup + i), ("B", i)]
    order += [("B", j) for j in range(n - warmup, n)]  # cool-down: drain what is in flight
    return order


def schedule_order(
    schedule: str, p: int, m: int, stage: int, backward_order: str = "same"
) -> list[tuple[str, int]]:
    """One step's op order on `stage`: [("F", 0), ("F", 1), ..., ("B", 0), ...].

    backward_order applies to gpipe only: "same" (B0..B(m-1), torch's ScheduleGPipe) or
    "reverse" (B(m-1)..B0). pipedream's one-step order is 1F1B's.
    """
    _check(schedule, p, m, stage)
    if schedule == "gpipe":
        if backward_order not in ("same", "reverse"):
            raise ValueError(f"backward_order must be 'same' or 'reverse', got {backward_order!r}")
        backwards = range(m) if backward_order == "same" else range(m - 1, -1, -1)
        return [("F", j) for j in range(m)] + [("B", j) for j in backwards]
    return _one_f_one_b(p, m, stage)


def _program(
    schedule: str, p: int, m: int, stage: int, steps: int, backward_order: str
) -> list[tuple[str, int, int]]:
    """(kind, step, microbatch) in the order the stage runs them over all steps."""
    if schedule == "pipedream":
        # No flush: the microbatches of all steps form one 1F1B stream.
        return [(kind, g // m, g % m) for kind, g in _one_f_one_b(p, steps * m, stage)]
    # A flush per step: the next step's ops simply follow this step's on each stage. Stage 0's
    # last backward is the last op of the step anyway, so no stage starts a step early.
    one = schedule_order(schedule, p, m, stage, backward_order)
    return [(kind, s, j) for s in range(steps) for kind, j in one]


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
    _check(schedule, p, m)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    f, b = _durations(fwd, p, m, "fwd"), _durations(bwd, p, m, "bwd")
    programs = [_program(schedule, p, m, s, steps, backward_order) for s in range(p)]

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
