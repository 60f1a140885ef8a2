"""What would the step cost on another network? Replay the measured steps as a dependency graph.

Each rank runs its program (tracekit.analyses.network_program): work at its measured pace,
posts of calls, waits for them. A matched call starts when its last member has posted it
(and the member's runloop thread has finished the call it ran before, as measured) and ends
on each member:

    end on rank r = max(start + floor_r, start + network)
    network = latency x hops + max over the call's NICs of (queue + bytes / inter-node rate),
              and intra-node link bytes / intra-node rate when that rate is given
    floor_r = the call's CPU cost on rank r: from the last member's arrival to r's end, as
              measured on an unshaped run (gloo's copies and reductions, loopback; ranks of
              one ring end apart); on a shaped run (run.json launch.network) minus the
              call's bytes at the run's own rate

A NIC is one direction of one node's link (tc tbf shapes every node's veth both ways), served
first come first served, so calls of different groups crossing at once share it. A wait ends
when the call has ended plus the measured resume lag; the time it blocks is the predicted
exposed communication. Work, compute and gaps keep their measured durations, so the replay
changes only what the network changes.

Reference points (docs/predict.md): ``measured`` mode gives every call its measured transfer
(the replay's own error against the trace: the calibration self-check); ``free`` is infinite
bandwidth and no latency (each call costs its floor); the knee is the bandwidth below which the
step is more than 10 % slower than free.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, cast

from tracekit.analyses.network_program import Call, Item, Program

KNEE_SLOWDOWN = 1.10  # "network-bound": the step is more than 10 % slower than free


@dataclass(frozen=True)
class Network:
    """What the replay assumes. Rates in bits per second; None: not limited beyond the floor."""

    inter_bits: float | None = None
    intra_bits: float | None = None
    latency_s: float = 0.0
    measured: bool = False  # every call takes its measured transfer time


@dataclass
class Replay:
    """Predicted times per rank (seconds) and the mapped marks."""

    step_time_s: dict[int, float | None]
    comm_s: dict[int, float]  # union of the rank's predicted call spans, per step
    exposed_comm_s: dict[int, float]  # time the rank blocked in waits, per step
    marks: dict[int, dict[tuple, float]] = field(default_factory=dict)  # rank -> key -> t (s)
    work: dict[int, dict[tuple, float]] = field(default_factory=dict)  # rank -> key -> work s
    steps: int = 0
    call_end_s: dict[str, float] = field(default_factory=dict)  # predicted end of each call
    span_start_s: dict[tuple[int, str], float] = field(default_factory=dict)  # (rank, call)


def floor_ns(call: Call, run_inter_bits: float | None, rank: int | None = None) -> float:
    """The call's CPU cost (see the module docstring): on ``rank``, from the last member's
    arrival to the rank's end as measured; else the call's measured transfer."""
    t = call.end_offset_ns.get(rank, call.transfer_ns) if rank is not None else call.transfer_ns
    if not run_inter_bits:
        return float(t)
    net = max(call.nic.values(), default=0.0) * 8 / run_inter_bits * 1e9
    return max(0.0, t - net)


def _dispatch(
    programs: dict[int, Program], calls: dict[str, Call]
) -> dict[tuple[int, str], tuple[str | None, int]]:
    """(rank, call) -> (call run before it on the same runloop thread, measured dispatch delay)."""
    out: dict[tuple[int, str], tuple[str | None, int]] = {}
    for rank, prog in programs.items():
        posts = sorted((i for i in prog.items if i.kind == "post"), key=lambda i: i.span_start_ns)
        last: dict[Any, Item] = {}
        for it in posts:
            prev = last.get(it.thread)
            # queued behind the call before it: only where the spans did not overlap (a gloo
            # runloop thread runs one call at a time; p2p spans on the calling thread overlap)
            if prev is not None and (
                prev.span_end_ns > it.span_start_ns
                or it.call_id not in calls
                or calls[it.call_id].op in ("send", "recv")
            ):
                prev = None
            ready = max(it.t_ns, prev.span_end_ns if prev is not None else it.t_ns)
            assert it.call_id is not None  # every post names its call
            out[(rank, it.call_id)] = (
                prev.call_id if prev is not None else None,
                max(0, it.span_start_ns - ready),
            )
            last[it.thread] = it
    return out


def replay(
    programs: dict[int, Program],
    calls: dict[str, Call],
    net: Network,
    run_inter_bits: float | None = None,
) -> Replay:
    """Run every rank's program against the network (see the module docstring)."""
    disp = _dispatch(programs, calls)
    items = {r: p.items for r, p in programs.items()}
    work = {r: [p.work_ns(it.t_ns) for it in p.items] for r, p in programs.items()}
    nxt = {r: 0 for r in programs}
    delay = {r: 0.0 for r in programs}  # predicted time - work time (ns)
    posted: dict[str, dict[int, float]] = {}
    end: dict[str, float] = {}  # call -> its last member's end
    end_at: dict[tuple[int, str], float] = {}  # (rank, call) -> its end on that rank
    span_start: dict[tuple[int, str], float] = {}
    parked: dict[str, list[int]] = {}
    nic_free: dict[tuple[int, str], float] = {}
    blocked_ns = {r: 0.0 for r in programs}
    marks: dict[int, dict[tuple, float]] = {r: {} for r in programs}
    marks_work: dict[int, dict[tuple, float]] = {r: {} for r in programs}
    waiting_on_prev: dict[str, list[str]] = {}

    def member_ends(call: Call, start: float) -> dict[int, float]:
        """rank -> when the call ends there: the measured offset from the last arrival
        (ranks of one ring end apart), or later when the network says so."""
        if net.measured:
            return {m: start + call.end_offset_ns.get(m, call.transfer_ns) for m in call.members}
        net_end = start
        if net.inter_bits:
            for k, b in sorted(call.nic.items()):
                s = max(start, nic_free.get(k, -math.inf))
                nic_free[k] = s + b * 8 / net.inter_bits * 1e9
                net_end = max(net_end, nic_free[k])
        if net.intra_bits and call.intra_bytes:
            net_end = max(net_end, start + call.intra_bytes * 8 / net.intra_bits * 1e9)
        if call.nic or call.intra_bytes:
            net_end += net.latency_s * 1e9 * call.hops
        return {m: max(start + floor_ns(call, run_inter_bits, m), net_end) for m in call.members}

    heap: list[tuple[float, int]] = []

    def push(r: int) -> None:
        if nxt[r] < len(items[r]):
            heapq.heappush(heap, (work[r][nxt[r]] + delay[r], r))

    def try_resolve(cid: str) -> None:
        call = calls[cid]
        got = posted.get(cid, {})
        if cid in end or any(m not in got for m in call.members):
            return
        starts = []
        for m in call.members:
            prev, d = disp.get((m, cid), (None, 0))
            if prev is not None and prev in calls and prev not in end:
                waiting_on_prev.setdefault(prev, []).append(cid)
                return
            ready = max(got[m], end_at.get((m, prev), -math.inf) if prev else -math.inf)
            span_start[(m, cid)] = ready + d
            starts.append(ready + d)
        ends = member_ends(call, max(starts))
        end[cid] = max(ends.values())
        end_at.update({(m, cid): t for m, t in ends.items()})
        for r in parked.pop(cid, []):
            push(r)
        for dep in waiting_on_prev.pop(cid, []):
            try_resolve(dep)

    for r in programs:
        push(r)
    while heap:
        _, r = heapq.heappop(heap)
        if nxt[r] >= len(items[r]):
            continue
        it, w = items[r][nxt[r]], work[r][nxt[r]]
        now = w + delay[r]
        if it.kind == "post":
            if it.call_id in calls:
                posted.setdefault(it.call_id, {})[r] = now
                try_resolve(it.call_id)
        elif it.kind == "wait" and it.call_id in calls:
            if it.call_id not in end:
                parked.setdefault(it.call_id, []).append(r)
                continue
            resume = max(end_at[(r, it.call_id)] + it.lag_ns, now + it.hold_ns)
            if resume > now:
                blocked_ns[r] += resume - now
                delay[r] = resume - w
        elif it.kind == "mark":
            assert it.key is not None  # every mark has its key
            marks[r][it.key] = now * 1e-9
            marks_work[r][it.key] = w * 1e-9
        nxt[r] += 1
        push(r)
    stuck = [r for r in programs if nxt[r] < len(items[r])]
    if stuck:
        raise ValueError(f"replay deadlocked: ranks {stuck} wait for calls that never start")

    step_time: dict[int, float | None] = {}
    comm: dict[int, float] = {}
    exposed: dict[int, float] = {}
    n_steps = 0
    for r, prog in programs.items():
        durs = [
            marks[r][(i, "end")] - marks[r][(i, "start")]
            for i, kind in (k for k in marks[r] if len(k) == 2)
            if kind == "start" and (i, "end") in marks[r]
        ]
        steps = max(1, len(durs))
        n_steps = max(n_steps, len(durs))
        step_time[r] = statistics.median(durs) if durs else None
        post_keys = [(r, cast(str, it.call_id)) for it in prog.items if it.kind == "post"]
        spans = sorted((span_start[k], end_at[k]) for k in post_keys if k in span_start)
        total, hi = 0.0, -math.inf
        for a, b in spans:  # union length of the spans
            if b > hi:
                total += b - max(a, hi)
                hi = b
        comm[r] = total * 1e-9 / steps
        exposed[r] = blocked_ns[r] * 1e-9 / steps
    return Replay(
        step_time,
        comm,
        exposed,
        marks,
        marks_work,
        n_steps,
        {k: v * 1e-9 for k, v in end.items()},
        {k: v * 1e-9 for k, v in span_start.items()},
    )


def slowest(rep: Replay) -> float | None:
    """The predicted step: the median step of the slowest rank."""
    vals = [v for v in rep.step_time_s.values() if v is not None]
    return max(vals) if vals else None


def log_points(lo: float, hi: float, per_decade: int = 4) -> list[float]:
    """Log-spaced bandwidths from lo to hi, both included."""
    if lo <= 0 or hi <= lo:
        raise ValueError("a sweep needs 0 < LO < HI")
    n = max(2, int(math.ceil(math.log10(hi / lo) * per_decade)) + 1)
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def bisect_log(f, lo: float, hi: float, iterations: int = 30) -> float:
    """The x in [lo, hi] where f changes sign (f(lo) and f(hi) of opposite signs), in log space."""
    flo = f(lo)
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
        if hi / lo < 1.001:
            break
    return math.sqrt(lo * hi)


def knee(step_at, free: float, lo: float, hi: float) -> tuple[float | None, str]:
    """The bandwidth below which the step is more than KNEE_SLOWDOWN x the free step."""
    f = lambda b: step_at(b) - KNEE_SLOWDOWN * free  # noqa: E731
    if f(hi) > 0:
        return None, f"network-bound over the whole sweep (even at {hi:.3g} bit/s)"
    if f(lo) <= 0:
        return None, f"not network-bound anywhere in the sweep (not even at {lo:.3g} bit/s)"
    return bisect_log(f, lo, hi), "ok"


def crossovers(step_a, step_b, points: list[float]) -> list[float]:
    """Bandwidths where two runs' predicted steps swap order, from the sweep, refined."""
    g = lambda b: step_a(b) - step_b(b)  # noqa: E731
    vals = [g(b) for b in points]
    out = []
    for (b0, v0), (b1, v1) in zip(zip(points, vals), zip(points[1:], vals[1:])):
        if (v0 > 0) != (v1 > 0):
            out.append(bisect_log(g, b0, b1))
    return out


def bubble_fraction(rep: Replay, stages: int) -> float | None:
    """Pipeline bubble of the replay: 1 - work inside F/B/W ops / (stages x sum of windows).

    Marks keyed ("op", step, i, "start"|"end"); work inside an op is its measured time minus the
    measured blocked time inside it, which the replay does not change."""
    windows: dict[int, list[float]] = {}
    busy = 0.0
    for r in rep.marks:
        m, w = rep.marks[r], rep.work[r]
        for key, t in m.items():
            if key[0] != "op" or key[-1] != "start":
                continue
            k_end = key[:-1] + ("end",)
            if k_end not in m:
                continue
            step = key[1]
            lo_hi = windows.setdefault(step, [math.inf, -math.inf])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], t), max(lo_hi[1], m[k_end])
            busy += w[k_end] - w[key]
    span = sum(b - a for a, b in windows.values())
    if not span or not stages:
        return None
    return 1.0 - busy / (stages * span)
