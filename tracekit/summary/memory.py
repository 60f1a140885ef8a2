"""summary.json ``memory`` and ``overlap``: what ZeRO/FSDP trade, bytes held against time hidden."""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record


class MemoryRank(Record):
    """One rank's bytes. The model states are counted by the run from the tensors the rank holds
    just before `optimizer.step()` of a step after the first (gradients and optimizer state both
    exist; ZeRO-3: its slices only); those counts are null when the run wrote no
    memory/rank<R>.json for the rank."""

    rank: Annotated[int, M("the rank")]
    params_bytes: Annotated[int | None, M("every parameter copy the rank keeps for compute")]
    grads_bytes: Annotated[int | None, M("gradients")]
    optimizer_bytes: Annotated[
        int | None, M("Adam moments and step counters, plus the fp32 master under bf16-mixed")
    ]
    model_states_bytes: Annotated[int | None, M("params + grads + optimizer")]
    activation_peak_bytes: Annotated[
        int | None,
        M(
            "bytes autograd saved for backward at their peak, parameters (and gathered ones) excluded"
        ),
    ]
    peak_bytes: Annotated[
        int | None,
        M(
            'the profiler\'s peak "Total Allocated", on the accelerator if any, else the CPU, '
            "where it counts only what the profiled steps allocated; null without memory events"
        ),
    ]
    peak_device: Annotated[str | None, M("the device of `peak_bytes` (`cpu`, `cuda:0`, ...)")]
    ratio_to_theory: Annotated[
        float | None, M("model_states_bytes / `theory.model_states_bytes`; null without either")
    ]


class MemoryTheory(Record):
    """The ZeRO paper's model-state bytes per rank for the run (null for TP and the pipelines,
    which the paper gives no formula for)."""

    model_states_bytes: Annotated[
        int, M("the formula's bytes per rank", theory="model_states_bytes")
    ]
    formula: Annotated[str, M("the formula, e.g. `4Psi+12Psi/N`")]
    psi: Annotated[int, M("Psi, parameters (run.json `config.params`)")]
    n: Annotated[
        int,
        M(
            "N, the ranks the states are sharded over (HSDP: shard size, else dp degree, else world)"
        ),
    ]
    precision: Annotated[
        str, M("`fp32` or `bf16-mixed` (bf16 params and grads, fp32 master and moments: K=12)")
    ]


class Memory(Record):
    """Every run that writes memory/rank<R>.json (dp, zero*, fsdp, hsdp, tp, the pipelines), or
    whose traces hold memory events; null otherwise."""

    per_rank: Annotated[list[MemoryRank], M("per rank")]
    theory: Annotated[MemoryTheory | None, M("the paper's formula for the run; null without one")]
    ratio_to_theory: Annotated[
        float | None,
        M(
            "mean over ranks of measured / formula (1.000 for every ZeRO run here; the rest is "
            "padding to a multiple of N and Adam's 4-byte step counters); null without a formula"
        ),
    ]


class OverlapLayer(Record):
    """One (unit, phase, op), in order of first appearance; times per rank, averaged over ranks."""

    unit: Annotated[str, M("the unit named by the label around the call (`unlabelled` if none)")]
    phase: Annotated[str, M("`fwd`, `bwd` or `step`")]
    op: Annotated[str, M("`all_gather` or `reduce_scatter`")]
    count: Annotated[int, M("calls over all ranks and steps")]
    duration_s: Annotated[float, M("transfer time, seconds")]
    hidden_s: Annotated[float, M("of it under the rank's compute, seconds")]
    exposed_s: Annotated[float, M("the rest, seconds")]
    hidden_fraction: Annotated[float | None, M("hidden / duration; null when duration is 0")]


class Overlap(Record):
    """How much all-gather and reduce-scatter transfer hides under compute (ZeRO-1/2/3, FSDP,
    HSDP; frame `overlap_units`); null when the trace has neither. Hidden: the transfer's overlap
    with the rank's compute (time blocked in a `comm:wait:*` label taken out); exposed: the rest."""

    ranks: Annotated[int, M("ranks the per-rank means cover")]
    steps: Annotated[int, M("the window's complete steps")]
    allgather_count: Annotated[int, M("all-gather calls over all ranks")]
    allgather_s: Annotated[float, M("all-gather transfer time per rank over the window, seconds")]
    allgather_hidden_s: Annotated[float, M("of it hidden, seconds")]
    allgather_exposed_s: Annotated[float, M("of it exposed, seconds")]
    allgather_hidden_fraction: Annotated[
        float | None, M("hidden / total; null without all-gathers")
    ]
    reducescatter_count: Annotated[int, M("reduce-scatter calls over all ranks")]
    reducescatter_s: Annotated[float, M("reduce-scatter transfer time per rank, seconds")]
    reducescatter_hidden_s: Annotated[float, M("of it hidden, seconds")]
    reducescatter_exposed_s: Annotated[float, M("of it exposed, seconds")]
    reducescatter_hidden_fraction: Annotated[
        float | None, M("hidden / total; null without reduce-scatters")
    ]
    per_layer: Annotated[list[OverlapLayer], M("per unit, phase and op")]
