"""Which schedule a pipeline ran, its microbatches, its bubble in theory and in a replay.

- schedule: run.json's strategy (its ``schedule`` in tracekit.strategies.registry), else what
  the labels say (torch's ``Forward i`` labels: GPipe; ``PP:`` actions: 1F1B, interleaved when
  a rank holds several stages; weight versions: PipeDream; else GPipe when every stage ran all
  forwards of a step before its first backward, 1F1B otherwise).
- bubble_fraction_theory: tracekit.theory.pipeline_bubble_fraction, (p-1)/(m+p-1) of the step
  for GPipe and 1F1B, (p-1)/(v m+p-1) interleaved with v stages per rank; None for PipeDream.
  ``bubble_fraction_theory_megatron``: tracekit.theory.megatron_bubble_ratio, bubble time
  relative to the ideal m (f+b), not a fraction of the step.
- bubble_fraction_replay: the schedule replayed (tracekit.analyses.replay) with the measured F and
  B busy durations per (stage, microbatch) and free communication: what the schedule alone
  costs; measured minus replay is what communication and contention add. GPipe/1F1B: each step
  replayed with its own durations (W folded into B), idle summed over the steps; PipeDream: one
  stream of all profiled steps with the median durations (its per-microbatch weight updates are
  not F/B: the replay leaves them out, and the measured windows count them as bubble).

Frame ``pipeline_replay`` (stage, kind, microbatch, start_s, end_s).
"""

from __future__ import annotations

import statistics
from typing import cast

import polars as pl

from tracekit import theory
from tracekit.analyses.replay import replay
from tracekit.ingest.run_record import RunRecord
from tracekit.strategies import registry

NS = 1e-9
REPLAY_SCHEMA = {
    "stage": pl.Int64,
    "kind": pl.Utf8,
    "microbatch": pl.Int64,
    "start_s": pl.Float64,
    "end_s": pl.Float64,
}


def schedule_of(run: RunRecord | None, ops: pl.DataFrame, source: str | None) -> str | None:
    """The schedule's name (see the module docstring)."""
    declared = registry.schedule_of(run.strategy if run is not None else None)
    if declared is not None:  # our pipelines say theirs (tracekit.strategies.registry)
        return declared
    if source == "torch_gpipe":
        return "gpipe"
    if source == "torch_actions":
        per_rank = ops.group_by("rank").agg(pl.col("stage").n_unique().alias("n"))
        return "interleaved" if cast(int, per_rank["n"].max()) > 1 else "1f1b"
    if ops["version"].drop_nulls().len():
        return "pipedream"
    # all forwards of a step before its first backward, on every stage: GPipe; else 1F1B
    firsts = ops.group_by("stage", "step").agg(
        pl.col("start_ns").filter(pl.col("kind") == "B").min().alias("b0"),
        pl.col("start_ns").filter(pl.col("kind") == "F").max().alias("f1"),
    )
    return "gpipe" if (firsts["f1"] < firsts["b0"]).all() else "1f1b"


def microbatches(run: RunRecord | None, ops: pl.DataFrame) -> int:
    """m: run.json's, else the most forwards of one stage in one step."""
    if run is not None and run.config.microbatches:
        return run.config.microbatches
    per = ops.filter(pl.col("kind") == "F").group_by("stage", "step").len()
    return int(cast("int | None", per["len"].max()) or 1)


def _durations(ops: pl.DataFrame, p: int, m: int) -> tuple[list[list[float]], list[list[float]]]:
    """Median busy seconds of F and of B (+W) per (stage, microbatch j); gaps filled per stage."""
    tab = (
        ops.with_columns(
            (pl.col("microbatch") % m).alias("j"),
            pl.when(pl.col("kind") == "F").then(pl.lit("F")).otherwise(pl.lit("B")).alias("fb"),
        )
        .group_by("stage", "step", "microbatch", "j", "fb")
        .agg(pl.col("busy_ns").sum())
        .group_by("stage", "j", "fb")
        .agg(pl.col("busy_ns").median())
    )
    got = {
        (s, j, fb): v * NS for s, j, fb, v in tab.select("stage", "j", "fb", "busy_ns").iter_rows()
    }
    out = []
    for fb in ("F", "B"):
        table = []
        for s in range(p):
            mine = [got[(s, j, fb)] for j in range(m) if (s, j, fb) in got]
            fill = statistics.median(mine) if mine else 0.0
            table.append([got.get((s, j, fb), fill) for j in range(m)])
        out.append(table)
    return out[0], out[1]


def _backward_order(ops: pl.DataFrame) -> str:
    b = ops.filter((pl.col("stage") == 0) & (pl.col("kind") == "B")).sort("start_ns")
    mbs = b.filter(pl.col("step") == b["step"].min())["microbatch"].to_list() if b.height else []
    return "reverse" if len(mbs) > 1 and mbs == sorted(mbs, reverse=True) else "same"


def theory_fractions(
    schedule: str | None, p: int, m: int, v: int
) -> tuple[float | None, float | None]:
    """(bubble_fraction_theory, bubble_fraction_theory_megatron) of the schedule."""
    value = None
    if schedule in ("gpipe", "1f1b"):
        value = theory.pipeline_bubble_fraction(p, m)
    elif schedule == "interleaved":
        value = theory.pipeline_bubble_fraction(p, m, v)
    megatron = (
        theory.megatron_bubble_ratio(p, m, v if schedule == "interleaved" else 1)
        if schedule != "pipedream"
        else None
    )
    return value, megatron


def replayed(
    schedule: str | None, ops: pl.DataFrame, steps: list[int], p: int, m: int
) -> tuple[float | None, pl.DataFrame, list[str]]:
    """(bubble_fraction_replay, frame ``pipeline_replay``, warnings): the schedule replayed with
    the measured durations of the steps whose pipeline windows are complete."""
    replay_value, replay_frame = None, pl.DataFrame(schema=REPLAY_SCHEMA)
    warnings: list[str] = []
    if schedule == "pipedream":
        # one stream over the profiled steps, median durations per (stage, microbatch)
        f, b = _durations(ops, p, m)
        res = replay(schedule, p, m, f, b, steps=max(1, len(steps)))
        replay_value = res.bubble_fraction
        replay_frame = res.ops.select(
            "stage",
            "kind",
            (pl.col("step") * m + pl.col("microbatch")).alias("microbatch"),
            pl.col("start").alias("start_s"),
            pl.col("end").alias("end_s"),
        ).cast(REPLAY_SCHEMA)  # type: ignore[arg-type]  # polars#14468: cast() rejects a dict[str, dtype]
    elif schedule in ("gpipe", "1f1b"):
        # each step replayed with its own measured durations; the replays laid back to back
        idle = total = offset = 0.0
        parts = []
        order = _backward_order(ops) if schedule == "gpipe" else "same"
        for step in steps:
            f, b = _durations(ops.filter(pl.col("step") == step), p, m)
            res = replay(schedule, p, m, f, b, backward_order=order)
            idle += res.bubble_fraction * p * res.makespan
            total += p * res.makespan
            parts.append(
                res.ops.select(
                    "stage",
                    "kind",
                    "microbatch",
                    (pl.col("start") + offset).alias("start_s"),
                    (pl.col("end") + offset).alias("end_s"),
                ).cast(REPLAY_SCHEMA)  # type: ignore[arg-type]  # polars#14468
            )
            offset += res.makespan
        replay_value = idle / total if total else None
        replay_frame = pl.concat(parts) if parts else replay_frame
    elif schedule is not None:
        warnings.append(
            f"pipeline: no replay for the {schedule} schedule (several stages per rank)"
        )
    return replay_value, replay_frame, warnings
