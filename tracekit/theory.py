"""Closed forms from the papers, beside which measurements are shown (docs/metrics.md "Theory").

The only place these formulas are written: analyses, runs and figures call them, and the
summary's fields name them (tracekit.summary, ``M(..., theory=...)``).
Psi = parameter count, N (or n) = data-parallel degree, p = pipeline stages, m = microbatches,
v = virtual stages per rank (interleaved schedules).
"""

from __future__ import annotations

# Model-state bytes per parameter: (replicated part, sharded part divided by N).
# bf16-mixed Adam (ZeRO paper, K=12): 2 bytes params + 2 grads + 12 optimizer (fp32 master + 2 moments).
# fp32 Adam: 4 params + 4 grads + 8 optimizer (2 moments).
_MODEL_STATES = {
    "fp32": {"dp": (16, 0), "zero1": (8, 8), "zero2": (4, 12), "zero3": (0, 16)},
    "bf16-mixed": {"dp": (16, 0), "zero1": (4, 12), "zero2": (2, 14), "zero3": (0, 16)},
}
_FORMULA = {
    "fp32": {"dp": "16Psi", "zero1": "8Psi+8Psi/N", "zero2": "4Psi+12Psi/N", "zero3": "16Psi/N"},
    "bf16-mixed": {
        "dp": "16Psi",
        "zero1": "4Psi+12Psi/N",
        "zero2": "2Psi+14Psi/N",
        "zero3": "16Psi/N",
    },
}


def model_states_bytes(family: str, precision: str, psi: int, n: int) -> dict | None:
    """{model_states_bytes, formula} per rank for a formula family (dp, zero1, zero2, zero3; which
    strategy follows which: ``theory`` in tracekit.strategies.registry), or None without one."""
    table = _MODEL_STATES.get(precision)
    if table is None or family not in table or psi <= 0 or n <= 0:
        return None
    replicated, sharded = table[family]
    return {
        "model_states_bytes": int(round(replicated * psi + sharded * psi / n)),
        "formula": _FORMULA[precision][family],
    }


def pipeline_bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Bubble as a fraction of the step: GPipe / 1F1B (p-1)/(m+p-1) (arXiv:1811.06965);
    interleaved with v stages per rank (p-1)/(v m+p-1) (Megatron, arXiv:2104.04473)."""
    return (p - 1) / (v * m + p - 1)


def megatron_bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time relative to the ideal time m(f+b): (p-1)/m; interleaved (p-1)/(v m)
    (Megatron, arXiv:2104.04473)."""
    return (p - 1) / m / v


def inflight_microbatches(schedule: str, p: int, r: int, m: int) -> int:
    """Forwards started whose backward has not ended, at stage r: GPipe m; 1F1B and PipeDream
    min(p-r, m) (warm-up p-r-1 forwards; arXiv:2006.09503, arXiv:1806.03377)."""
    return m if schedule == "gpipe" else min(p - r, m)


def pipedream_weight_versions(p: int, s: int) -> int:
    """Weight versions PipeDream keeps at stage s: p-s (arXiv:1806.03377)."""
    return p - s


def ring_volume_per_rank(psi_bytes: int, n: int, stage: str = "dp") -> float:
    """Bytes each rank sends per step under ideal rings: DP/ZeRO-1/2 2Psi(n-1)/n, ZeRO-3 3Psi(n-1)/n."""
    factor = 3 if stage == "zero3" else 2
    return factor * psi_bytes * (n - 1) / n
