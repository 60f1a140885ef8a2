"""summary.json ``pipeline``: bubbles per stage against theory and a replay (null without
pipeline labels)."""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record


class PipelineStage(Record):
    """One pipeline rank (its first stage; interleaved ranks hold several)."""

    stage: Annotated[int, M("the rank's first stage")]
    rank: Annotated[int, M("the rank")]
    stages_on_rank: Annotated[list[int], M("every stage the rank holds (interleaved: v)")]
    fill_s: Annotated[float, M("bubble before the rank's first op of each step, summed, seconds")]
    steady_s: Annotated[float, M("bubble in the gaps between its ops, summed, seconds")]
    drain_s: Annotated[float, M("bubble after its last op of each step, summed, seconds")]
    busy_s: Annotated[float, M("busy time inside the pipeline windows, seconds")]
    window_s: Annotated[float, M("the pipeline windows summed over steps, seconds")]
    bubble_fraction: Annotated[
        float | None, M("1 - busy / window for this rank; null without a window")
    ]
    bubble_fraction_span: Annotated[
        float | None,
        M("1 - busy / span over the whole profiled span, weight updates busy; null without span"),
    ]
    max_inflight_microbatches: Annotated[
        int,
        M(
            "forwards started whose backward has not ended: GPipe m, 1F1B p-r on stage r",
            theory="inflight_microbatches",
        ),
    ]
    activation_peak_bytes: Annotated[
        int | None, M('from memory/rank<R>.json (see "Memory"); null when the run did not count it')
    ]
    activation_bytes_per_microbatch: Annotated[
        int | None, M("the same per in-flight microbatch; null when not counted")
    ]
    weight_versions: Annotated[
        int | None,
        M(
            "PipeDream: most distinct weight versions among in-flight microbatches (p-s); null "
            "for flushing schedules",
            theory="pipedream_weight_versions",
        ),
    ]
    staleness_max: Annotated[
        int | None, M("PipeDream: largest `st<k>` of the rank's B labels; null without them")
    ]
    staleness_mean: Annotated[float | None, M("PipeDream: their mean; null without them")]
    recv_s: Annotated[float, M("time blocked in recv, seconds")]
    recv_wait_s: Annotated[float, M("of it, before the matching send started on the peer, seconds")]
    recv_transfer_s: Annotated[float, M("of it, after the matching send started, seconds")]
    recv_unmatched_s: Annotated[float, M("of it, with no matching send traced, seconds")]


class Pipeline(Record):
    """The pipeline section; fractions are of stages x pipeline windows unless said otherwise."""

    schedule: Annotated[
        str | None,
        M(
            "`gpipe`, `1f1b`, `interleaved` or `pipedream`: run.json's strategy, else from the "
            "labels and the op order; null when none fits"
        ),
    ]
    source: Annotated[
        str, M("the labels read: tracekit's `F:`/`B:` labels, or torch.distributed.pipelining's")
    ]
    stages: Annotated[int, M("p, pipeline stages (run.json's, else the ranks with ops)")]
    virtual_stages: Annotated[int, M("stages traced, over all ranks (interleaved: v p)")]
    microbatches: Annotated[int, M("m, microbatches per step")]
    steps: Annotated[int, M("steps with a pipeline window")]
    bubble_fraction: Annotated[
        float | None,
        M("sum of bubbles / (stages x sum of windows); null without a window"),
    ]
    bubble_fraction_span: Annotated[
        float | None,
        M(
            "the same over the whole profiled span, weight updates counted as busy: compare "
            "PipeDream (no flush) with GPipe here; null without a span"
        ),
    ]
    bubble_fraction_theory: Annotated[
        float | None,
        M(
            "(p-1)/(m+p-1) of the step (GPipe, 1F1B; interleaved: (p-1)/(v m+p-1)); null for "
            "PipeDream",
            theory="pipeline_bubble_fraction",
        ),
    ]
    bubble_fraction_theory_basis: Annotated[
        str | None, M("which formula `bubble_fraction_theory` is, in words; null with it")
    ]
    bubble_fraction_theory_megatron: Annotated[
        float | None,
        M(
            "(p-1)/m (interleaved (p-1)/(v m)): bubble time relative to the ideal m(f+b); null for "
            "PipeDream",
            theory="megatron_bubble_ratio",
        ),
    ]
    bubble_fraction_theory_megatron_basis: Annotated[
        str | None, M("which formula that is, in words; null with it")
    ]
    bubble_fraction_replay: Annotated[
        float | None,
        M(
            'bubble_fraction of the replay (see "replay" above); null when not every stage '
            "is traced or the schedule has no replay (interleaved)"
        ),
    ]
    window_s: Annotated[
        float | None, M("the mean pipeline window of a step, seconds; null without one")
    ]
    span_s: Annotated[float, M("the whole profiled span of the pipeline ranks, seconds")]
    recv_split_method: Annotated[
        str, M("how recv time was split: `labels`, or p2p spans in order (blocking ones only)")
    ]
    per_stage: Annotated[list[PipelineStage], M("per rank, by stage")]
