"""summary.json ``memory``: each rank's model states, activations and peak, beside ZeRO's formulas.

Per rank (``per_rank[]``), for every strategy that writes ``memory/rank<R>.json`` through the
harness (DP, ZeRO-1/2/3, FSDP, HSDP, TP, the pipelines):

- ``params_bytes``, ``grads_bytes``, ``optimizer_bytes`` (Adam moments, plus the fp32 master copy
  under bf16-mixed), ``model_states_bytes`` (their sum): counted by the run from the tensors the
  rank holds just before ``optimizer.step()`` of a step after the first (tracekit.capture), never
  from a formula;
- ``activation_peak_bytes``: the peak bytes autograd saved for backward (capture.ActivationMeter,
  parameters excluded), when the run measured it;
- ``peak_bytes``: the profiler's peak ``Total Allocated`` from the trace's ``[memory]`` events
  (TraceInfo.memory_peak_bytes) on the rank's accelerator if it has one, else on the CPU, with
  ``peak_device``. On CPU the profiler only counts tensors allocated while it records, so this is
  the peak of what the profiled steps allocated (model states made before are not in it); on GPU
  it is the caching allocator's total;
- ``ratio_to_theory`` = model_states_bytes / theory.

``theory``: the ZeRO paper's model-state bytes per rank (tracekit.theory, arXiv:1910.02054) for
the run's strategy and precision, with Psi = run.json ``config.params`` and N = the degree the
states are sharded over (``strategy_options.shard_size`` for HSDP, else ``dp_degree``, else the
world size): DP 16Psi; ZeRO-1 fp32 8Psi+8Psi/N, bf16-mixed 4Psi+12Psi/N; ZeRO-2 4Psi+12Psi/N,
2Psi+14Psi/N; ZeRO-3, FSDP and HSDP 16Psi/N. Null for strategies the paper gives no formula for
(TP, pipelines), whose per_rank rows are still reported. ``ratio_to_theory`` at the top is the mean
over ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tracekit import theory
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.ingest.run_record import MemoryCounts, RunRecord
from tracekit.strategies import registry
from tracekit.summary.memory import Memory, MemoryRank, MemoryTheory

STATE_KEYS = (
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "model_states_bytes",
    "activation_peak_bytes",
)


def _peak(peaks: dict[str, int]) -> tuple[int | None, str | None]:
    """The accelerator's peak if the rank has one, else the CPU's."""
    if not peaks:
        return None, None
    accel = {d: b for d, b in peaks.items() if d != "cpu"}
    device = (
        max(accel, key=accel.__getitem__)
        if accel
        else ("cpu" if "cpu" in peaks else next(iter(peaks)))
    )
    return int(peaks[device]), device


def sharding_degree(run: RunRecord) -> int:
    """N of the formulas: the number of ranks the model states are partitioned over."""
    return run.config.shard_degree or run.world_size or 1


def theory_for(run: RunRecord | None) -> dict[str, Any] | None:
    """{model_states_bytes, formula, psi, n, precision} for the run, or None."""
    if not run:
        return None
    psi = run.config.params
    strategy = str(run.strategy)
    precision = run.precision or run.config.precision or "fp32"
    n = sharding_degree(run)
    family = registry.theory_of(strategy)  # e.g. fsdp, hsdp (ZeRO-3 inside a node) -> zero3
    value = None if family is None else theory.model_states_bytes(family, precision, psi, n)
    return None if value is None else {**value, "psi": psi, "n": n, "precision": precision}


def memory_rows(
    counts: Mapping[int, MemoryCounts],
    run: RunRecord | None,
    peaks: dict[int, dict[str, int]],
) -> list[dict[str, Any]]:
    """per_rank rows: every rank with a trace (its peak) or with counts (memory/rank<R>.json)
    below the run's world size."""
    world = run.world_size or 0 if run is not None else 0
    ranks = sorted(set(peaks) | {r for r in counts if r < world})
    expected = theory_for(run)
    rows = []
    for rank in ranks:
        counted = counts.get(rank)
        peak, device = _peak(peaks.get(rank, {}))
        if counted is None and peak is None:
            continue
        row = {
            "rank": rank,
            **{k: getattr(counted, k) if counted else None for k in STATE_KEYS},
            "peak_bytes": peak,
            "peak_device": device,
        }
        states = row["model_states_bytes"]
        row["ratio_to_theory"] = (
            states / expected["model_states_bytes"]
            if expected and states is not None and expected["model_states_bytes"]
            else None
        )
        rows.append(row)
    return rows


def memory(inp: SectionInput) -> SectionResult[Memory]:
    """The ``memory`` section (see the module docstring)."""
    peaks = {i.rank: dict(i.memory_peak_bytes or {}) for i in inp.infos}
    rows = memory_rows(inp.job.memory, inp.run, peaks)
    if not rows:
        return SectionResult()
    expected = theory_for(inp.run)
    ratios = [r["ratio_to_theory"] for r in rows if r["ratio_to_theory"] is not None]
    warnings = []
    if inp.run and not any(r["model_states_bytes"] is not None for r in rows):
        warnings.append(
            "memory: the run wrote no memory/rank<R>.json; only the profiler's peaks are shown"
        )
    value = Memory(
        per_rank=msgspec.convert(rows, list[MemoryRank], strict=True),
        theory=None
        if expected is None
        else MemoryTheory(
            model_states_bytes=expected["model_states_bytes"],
            formula=expected["formula"],
            psi=expected["psi"],
            n=expected["n"],
            precision=expected["precision"],
        ),
        ratio_to_theory=sum(ratios) / len(ratios) if ratios else None,
    )
    return SectionResult(value, {}, warnings)
