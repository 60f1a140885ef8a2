"""summary.json ``pipeline``: bubbles per stage and step, measured against theory and a replay.

The steps, one module each (definitions in their docstrings; docs/metrics.md "Pipeline"):

- tracekit.analyses.pipeline_ops: which spans are pipeline compute (tracekit's
  ``F|B|W:s<stage>:mb<m>`` labels, torch.distributed.pipelining's ``Forward i`` and
  ``PP:<stage><action><mb>``) and each op's busy time (blocking communication taken out);
- tracekit.analyses.pipeline_bubble: pipeline windows, bubbles (fill, steady, drain),
  bubble_fraction and bubble_fraction_span;
- tracekit.analyses.pipeline_schedule: the schedule, m, the bubble in theory and in a replay
  (tracekit.analyses.replay);
- tracekit.analyses.pipeline_stage: microbatches in flight, weight versions, recv split.

Frames: ``pipeline_ops`` (rank, stage, step, kind, microbatch, version, start_ns, end_ns),
``bubbles`` (rank, stage, step, phase, start_ns, end_ns), ``pipeline_replay`` (stage, kind,
microbatch, start_s, end_s).
"""

from __future__ import annotations

from typing import cast

import msgspec
import polars as pl

from tracekit.analyses.pipeline_bubble import BUBBLES_SCHEMA, span_busy, step_bubbles, step_windows
from tracekit.analyses.pipeline_ops import OPS_SCHEMA, ops_source
from tracekit.analyses.pipeline_schedule import (
    REPLAY_SCHEMA,
    microbatches,
    replayed,
    schedule_of,
    theory_fractions,
)
from tracekit.analyses.pipeline_stage import recv_split, stage_rows
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.summary.pipeline import Pipeline, PipelineStage

NS = 1e-9
SOURCES: dict[str | None, str] = {  # keyed by pipeline_ops' source (None: no ops)
    "tracekit": "tracekit labels (F|B|W:s<stage>:mb<m>)",
    "torch_gpipe": "torch.distributed.pipelining ScheduleGPipe (Forward i / Backward i)",
    "torch_actions": "torch.distributed.pipelining multi-stage schedule (PP:<stage><F|I|B|W><mb>)",
}


def pipeline(inp: SectionInput) -> SectionResult[Pipeline]:
    """The ``pipeline`` section of summary.json, its frames and warnings (None: no pipeline)."""
    # pipeline_ops, computed per rank by the map
    ops, pieces = inp.per_rank.pipeline_ops, inp.per_rank.pipeline_pieces
    if ops.height == 0:
        return SectionResult()
    source = ops_source(ops)
    warnings: list[str] = []
    run = inp.run
    schedule = schedule_of(run, ops, source)
    m = microbatches(run, ops)
    if m > ops.height:  # run.json's count sizes the replay's tables: never past the ops traced
        warnings.append(
            f"pipeline: run.json says {m} microbatches but the traces hold {ops.height} "
            "pipeline ops; counted from the traces"
        )
        m = microbatches(None, ops)
    stages = sorted(ops["stage"].unique().to_list())
    ranks = sorted(ops["rank"].unique().to_list())
    stage_of_rank = {
        r: int(cast(int, ops.filter(pl.col("rank") == r)["stage"].min())) for r in ranks
    }
    p_devices = len(ranks)
    v = max(1, len(stages) // max(1, p_devices))

    win = step_windows(ops)
    per, bubble_rows = step_bubbles(win, pieces, stage_of_rank)
    total_window = sum(per[r]["window"] for r in ranks)
    bubble_fraction = (
        (sum(per[r]["window"] - per[r]["busy"] for r in ranks) / total_window)
        if total_window
        else None
    )
    span, busy = span_busy(inp.events, inp.windows, pieces, ranks)
    span_idle = sum(span - busy[r] for r in ranks)
    bubble_fraction_span = span_idle / (p_devices * span) if span > 0 else None

    # theory and replay (over the whole pipeline: a --ranks subset gets theory, not a replay)
    p = (run.config.stages if run is not None else None) or p_devices
    # len first: p is run.json's word, and list(range(p)) would be as long as it says
    complete = schedule == "interleaved" or (
        len(stages) == p == p_devices and stages == list(range(p))
    )
    theory_value, megatron = theory_fractions(schedule, p, m, v)
    if complete:
        replay_value, replay_frame, replay_warnings = replayed(
            schedule, ops, win["step"].to_list(), p, m
        )
        warnings += replay_warnings
    else:
        replay_value, replay_frame = None, pl.DataFrame(schema=REPLAY_SCHEMA)
        warnings.append(f"pipeline: the traces hold stages {stages} of {p}: no replay")

    recv, recv_method = recv_split(
        inp.events, stage_of_rank, inp.collectives, inp.per_rank.blocking
    )
    memory = inp.job.memory if run is not None else {}
    per_stage = stage_rows(ops, stage_of_rank, per, span, busy, recv, memory)

    summary = Pipeline(
        schedule=schedule,
        source=SOURCES[source] if source in SOURCES else str(source),
        stages=p,
        virtual_stages=len(stages),
        microbatches=m,
        steps=win.height,
        bubble_fraction=bubble_fraction,
        bubble_fraction_span=bubble_fraction_span,
        bubble_fraction_theory=theory_value,
        bubble_fraction_theory_basis="fraction of the step: (p-1)/(m+p-1)"
        if theory_value is not None and schedule != "interleaved"
        else ("fraction of the step: (p-1)/(v m+p-1)" if theory_value is not None else None),
        bubble_fraction_theory_megatron=megatron,
        bubble_fraction_theory_megatron_basis="bubble time / ideal time m(f+b): (p-1)/m"
        if megatron is not None
        else None,
        bubble_fraction_replay=replay_value,
        window_s=(total_window / max(1, win.height) / max(1, p_devices)) * NS
        if total_window
        else None,
        span_s=span * NS,
        recv_split_method=recv_method,
        per_stage=msgspec.convert(per_stage, list[PipelineStage], strict=True),
    )
    frames = {
        # polars#14468: cast() is typed to reject a dict[str, dtype] (it takes one at run time)
        "pipeline_ops": ops.select(list(OPS_SCHEMA)).cast(OPS_SCHEMA).sort("rank", "start_ns"),  # type: ignore[arg-type]
        "bubbles": pl.DataFrame(bubble_rows, schema=BUBBLES_SCHEMA).sort("rank", "start_ns"),
        "pipeline_replay": replay_frame,
    }
    return SectionResult(summary, frames, warnings)
