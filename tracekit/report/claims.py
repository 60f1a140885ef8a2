"""The papers' claims, checked on a set of runs (#27): one line per claim, with the measured
figures, a verdict, and the measured reason when a claim does not hold.

Each check reads only the typed summaries (and run.json's strategy options, for ZeRO-3's
prefetch), so the demo, ``tracekit compare`` and the comparison report say the same:

- GPipe (Huang et al. 2019): the bubble within 0.10 of the replay's, theory (p-1)/(m+p-1) beside;
- 1F1B (Narayanan et al. 2019, PipeDream-Flush): activation peak below GPipe's;
- PipeDream (asynchronous): busier than GPipe (a smaller bubble over the whole span);
- ZeRO (Rajbhandari et al. 2020): model-state bytes per rank within 5 % of the formula;
- ZeRO-3: bytes per rank per step 1.5x DP's (within 0.1);
- prefetch: it hides more of ZeRO-3's all-gathers, and whether the step got shorter;
- HSDP: a smaller share of its bytes crosses nodes than FSDP's.

A claim whose runs are not in the set is left out. Where timings are involved, a run whose ranks
waited for a CPU (summary.json ``contention``) or whose steps vary (``steps``) says so: the
measured reason, not a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracekit.summary import Summary
from tracekit.summary.contention import CORUN_SLOW, Contention

HOLDS, FAILS, NOISE = "holds", "does not hold", "within noise"


@dataclass(frozen=True)
class Claim:
    """One claim checked: what the paper says, what was measured, the verdict, and why."""

    claim: str
    measured: str
    verdict: str
    why: str | None = None

    def line(self) -> str:
        why = f" — {self.why}" if self.why else ""
        return f"{self.claim}: {self.measured}: {self.verdict}{why}"


@dataclass(frozen=True)
class _Run:
    summary: Summary
    prefetch: int | None
    label: str


def _runs(analyses: Sequence[Any]) -> dict[str, _Run]:
    """strategy (zero3: ``zero3@<prefetch>``) -> its first run in the set."""
    out: dict[str, _Run] = {}
    for a in analyses:
        s: Summary = a.summary
        if s.run is None or not s.run.strategy:
            continue
        opts = ((a.run or {}).get("config") or {}).get("strategy_options") or {}
        prefetch = opts.get("prefetch") if isinstance(opts.get("prefetch"), int) else None
        key = s.run.strategy + (f"@{prefetch}" if s.run.strategy == "zero3" else "")
        label = s.run.strategy + (f" (prefetch {prefetch})" if s.run.strategy == "zero3" else "")
        out.setdefault(key, _Run(s, prefetch, label))
    return out


def cpu_wait_words(c: Contention) -> str:
    """How long a run's ranks waited for a CPU, in words (the demo line and the claims)."""
    assert c.cpu_wait_share_max is not None
    words = f"waited for a CPU up to {c.cpu_wait_share_max:.0%} of their steps"
    behind = c.cpu_wait_outside_share_max
    words += f", {behind:.0%} behind other processes" if behind is not None else ""
    slow = c.corun_slowdown_max
    return words + (
        f"; beside other ranks, compute took {slow:.2f}x its time alone" if slow else ""
    )


def _contended(*runs: _Run) -> str | None:
    """The measured reason timings may be off: CPU waiting, step spread."""
    parts = []
    for r in runs:
        c, st, who = r.summary.contention, r.summary.steps, r.label
        slowed = c is not None and (c.corun_slowdown_max or 0) > CORUN_SLOW
        if c is not None and c.cpu_wait_share_max is not None and (c.inflated or slowed):
            parts.append(f"{who}'s ranks {cpu_wait_words(c)}")
        if st is not None and st.spread > 0.25:
            parts.append(f"{who}'s step varied {st.spread:.0%}")
    return "; ".join(parts) or None


def _nodes(r: _Run) -> int:
    return len(set(r.summary.topology.nodes.values())) if r.summary.topology else 1


def _peak(s: Summary) -> int | None:
    peaks = [r.activation_peak_bytes for r in (s.memory.per_rank if s.memory else [])]
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


def _step(s: Summary) -> float | None:
    return s.steps.median_s if s.steps else None


def claims(analyses: Sequence[Any]) -> list[Claim]:
    """Every claim whose runs are in ``analyses`` (tracekit.analysis.Analysis), in order."""
    runs = _runs(analyses)
    out: list[Claim] = []
    gp, fb, pd = runs.get("pp-gpipe"), runs.get("pp-1f1b"), runs.get("pp-pipedream")
    p = gp.summary.pipeline if gp else None
    if gp and p and p.bubble_fraction is not None and p.bubble_fraction_replay is not None:
        gap = p.bubble_fraction - p.bubble_fraction_replay
        out.append(
            Claim(
                "GPipe's bubble is the schedule's",
                f"measured {p.bubble_fraction:.1%}, replay {p.bubble_fraction_replay:.1%}"
                + (
                    f", theory {p.bubble_fraction_theory:.1%}"
                    if p.bubble_fraction_theory is not None
                    else ""
                ),
                HOLDS if abs(gap) <= 0.10 else FAILS,
                None if abs(gap) <= 0.10 else _contended(gp) or "p2p latency on loopback",
            )
        )
    if gp and fb and (a := _peak(fb.summary)) is not None and (b := _peak(gp.summary)):
        out.append(
            Claim(
                "1F1B keeps fewer activations than GPipe",
                f"peak {a / 1e6:.1f} MB vs {b / 1e6:.1f} MB",
                HOLDS if a < b else FAILS,
            )
        )
    if gp and pd and gp.summary.pipeline and pd.summary.pipeline:
        a_span = pd.summary.pipeline.bubble_fraction_span
        b_span = gp.summary.pipeline.bubble_fraction_span
        if a_span is not None and b_span is not None:
            out.append(
                Claim(
                    "PipeDream is busier than GPipe (no flush)",
                    f"bubble over the span {a_span:.1%} vs {b_span:.1%}",
                    HOLDS if a_span < b_span else FAILS,
                    None if a_span < b_span else _contended(pd, gp),
                )
            )
    out += _zero_claims(runs)
    fs, hs = runs.get("fsdp"), runs.get("hsdp")
    if fs and hs and _nodes(fs) != _nodes(hs):
        out.append(
            Claim(
                "HSDP keeps its heavy traffic inside nodes",
                f"FSDP ran on {_nodes(fs)} node(s), HSDP on {_nodes(hs)}",
                "not comparable",
            )
        )
    elif fs and hs and fs.summary.traffic and hs.summary.traffic:
        a_in, b_in = hs.summary.traffic.inter_node_fraction, fs.summary.traffic.inter_node_fraction
        if a_in is not None and b_in is not None:
            out.append(
                Claim(
                    "HSDP keeps its heavy traffic inside nodes",
                    f"inter-node share of bytes {a_in:.1%} vs FSDP's {b_in:.1%}",
                    HOLDS if a_in < b_in else FAILS,
                )
            )
    return out


def _zero_claims(runs: dict[str, _Run]) -> list[Claim]:
    out = []
    ratios = {
        k: r.summary.memory.ratio_to_theory
        for k, r in runs.items()
        if k.split("@")[0] in ("dp", "zero1", "zero2", "zero3") and r.summary.memory
    }
    known = {k.split("@")[0]: v for k, v in ratios.items() if v is not None}
    if known:
        worst = max(known.values(), key=lambda v: abs(v - 1))
        out.append(
            Claim(
                "ZeRO's model states per rank follow the formula",
                ", ".join(f"{k} {v:.3f}x" for k, v in known.items()),
                HOLDS if abs(worst - 1) <= 0.05 else FAILS,
            )
        )
    dp, z3 = runs.get("dp"), runs.get("zero3@1") or runs.get("zero3@0")
    if dp and z3 and dp.summary.volume and z3.summary.volume:
        a, b = (
            z3.summary.volume.ideal_bytes_per_rank_per_step,
            dp.summary.volume.ideal_bytes_per_rank_per_step,
        )
        if a and b:
            out.append(
                Claim(
                    "ZeRO-3 moves 1.5x DP's bytes",
                    f"{a / b:.2f}x per rank per step",
                    HOLDS if abs(a / b - 1.5) <= 0.1 else FAILS,
                )
            )
    off, on = runs.get("zero3@0"), runs.get("zero3@1")
    if off and on and off.summary.overlap and on.summary.overlap:
        h0, h1 = (
            off.summary.overlap.allgather_hidden_fraction,
            on.summary.overlap.allgather_hidden_fraction,
        )
        if h0 is not None and h1 is not None:
            out.append(
                Claim(
                    "ZeRO-3 prefetch hides the all-gathers",
                    f"hidden {h1:.0%} with prefetch vs {h0:.0%} without",
                    HOLDS if h1 > h0 else FAILS,
                )
            )
        out.append(_prefetch_step(off, on))
    return out


def _prefetch_step(off: _Run, on: _Run) -> Claim:
    a, b = _step(on.summary), _step(off.summary)
    what = "ZeRO-3 prefetch shortens the step"
    if a is None or b is None or off.summary.steps is None or on.summary.steps is None:
        return Claim(what, "no step times", "not measured")
    measured = f"{a:.3g} s with prefetch vs {b:.3g} s without"
    if (
        on.summary.steps.min_s <= off.summary.steps.max_s
        and off.summary.steps.min_s <= on.summary.steps.max_s
    ):
        return Claim(what, measured, NOISE, _contended(on, off))
    if a < b:
        return Claim(what, measured, HOLDS)
    loopback = "gloo's transfers on one machine are CPU work, so hiding them frees no time"
    return Claim(what, measured, FAILS, "; ".join(x for x in (_contended(on, off), loopback) if x))
