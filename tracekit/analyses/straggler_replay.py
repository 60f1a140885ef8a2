"""What would the step take if one rank worked faster? ``tracekit predict --without-straggler``.

The network replay (tracekit.analyses.network_replay) with every call at its measured transfer
(``Network(measured=True)``: the self-check's conditions), on per-rank programs
(tracekit.analyses.network_program) whose work is changed on the chosen ranks only:

    rank r at speed s: each second of its work (what the replay runs at measured pace: its
    window less the time it was blocked in waits, i.e. compute, the CPU side of its calls,
    memcpy/sync and the gaps between ops) takes 1/s seconds; every other rank keeps its
    measured work, and every wait is recomputed by the replay.

``--rank-speed R:S`` gives s; ``--without-straggler`` takes the why analysis's top cause d
(summary.json ``why.top_cause``, Böhme et al.'s delay analysis) and removes its excess: in each
interval i between consecutive synchronisation points (the posts of calls every rank makes,
and the step marks, where they come in the same order on every rank), d's work is set to what
its busiest peer needed between the same points (Böhme et al.'s excess since the previous
synchronisation point),

    s_i = work_d,i / max over the other ranks r of work_r,i      (at least 1: never slower)

with work = the interval's span less the time the rank was blocked in waits (waiting and
exposed transfer: the programs' blocked intervals). Interval by interval, because an excess is
rarely even: one window-wide speed sped d's optimizer and its calls' CPU side, which its peers
did as slowly, and left its inflated forward and backward late, so the replay still waited at
every call (fsdp: +28 % over the clean run's step). Work outside the intervals runs at the
window's speed (``speed``: work_d / max peer work, per profiled step). A speed of 1 or less (no excess) leaves
the step as replayed. docs/predict.md "Straggler what-if".
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tracekit.analyses import network_replay as model
from tracekit.analyses.network_program import Call, Program

#: points of a --rank-speed R:LO:HI curve
CURVE_POINTS = 9


Segment = tuple[int, int, float]  # measured [t0, t1) ns and the speed of the work in it


@dataclass
class ScaledProgram(Program):
    """A rank's program whose work runs ``speed`` times as fast, or ``segments[i][2]`` times in
    the measured time of segment i (sorted, disjoint; see the module docstring)."""

    speed: float = 1.0
    segments: tuple[Segment, ...] = ()

    def work_ns(self, t: int) -> int:
        base = super().work_ns
        done, at = 0.0, self.start_ns
        for t0, t1, speed in self.segments:
            if t0 >= t:
                break
            if at < t0:
                done += (base(t0) - base(at)) / self.speed
                at = t0
            end = min(t1, t)
            if end > at:
                done += (base(end) - base(at)) / speed
                at = end
        if at < t:
            done += (base(t) - base(at)) / self.speed
        return int(base(self.start_ns) + done)


def scaled(
    progs: dict[int, Program],
    speeds: dict[int, float],
    segments: dict[int, tuple[Segment, ...]] | None = None,
) -> dict[int, Program]:
    """The programs with ``speeds[r]`` (and ``segments[r]``) applied to rank r's work (others
    unchanged)."""
    segments = segments or {}
    out: dict[int, Program] = {}
    for r, p in progs.items():
        base = {f.name: getattr(p, f.name) for f in fields(Program)}
        if r in speeds or r in segments:
            out[r] = ScaledProgram(**base, speed=speeds.get(r, 1.0), segments=segments.get(r, ()))
        else:
            out[r] = p
    return out


def _step_marks(p: Program) -> dict[int, tuple[int, int]]:
    """Step index -> (start, end) measured ns, from the program's marks."""
    at = {it.key: it.t_ns for it in p.items if it.kind == "mark" and it.key and len(it.key) == 2}
    return {
        k[0]: (t, at[(k[0], "end")])
        for k, t in at.items()
        if k[1] == "start" and (k[0], "end") in at
    }


def _boundaries(p: Program) -> dict[tuple, int]:
    """The points every rank passes, by key: its posts of calls (("call", id)) and its step
    marks (("mark", step, "start"|"end")), at measured ns."""
    out: dict[tuple, int] = {}
    for it in p.items:
        if it.kind == "post" and it.call_id is not None:
            out.setdefault(("call", it.call_id), it.t_ns)
        elif it.kind == "mark" and it.key:
            out.setdefault(("mark", *it.key), it.t_ns)
    return out


def excess_segments(progs: dict[int, Program], rank: int) -> tuple[Segment, ...]:
    """RANK's excess, interval by interval (Böhme et al.'s delay: the work it did since the
    previous synchronisation point that its peers did not have to do): between consecutive
    points every rank passes in the same order (calls' posts, step marks), the interval runs at
    s_i = its work there / its busiest peer's work between the same points (at least 1)."""
    points = {r: _boundaries(p) for r, p in progs.items()}
    mine = points.get(rank, {})
    peers = [r for r in progs if r != rank]
    shared = sorted((t, key) for key, t in mine.items() if all(key in points[r] for r in peers))
    kept: list[tuple] = []  # points in the same order on every rank
    for _, key in shared:
        if not kept or all(points[r][key] > points[r][kept[-1]] for r in [rank, *peers]):
            kept.append(key)
    out = []
    for k0, k1 in zip(kept, kept[1:]):
        t0, t1 = mine[k0], mine[k1]
        w = progs[rank].work_ns(t1) - progs[rank].work_ns(t0)
        pw = max(progs[r].work_ns(points[r][k1]) - progs[r].work_ns(points[r][k0]) for r in peers)
        if w > 0 and pw > 0:
            out.append((t0, t1, max(1.0, w / pw)))
    return tuple(out)


def step_times(rep: model.Replay) -> list[float]:
    """Per step index, the slowest rank's step (from the replay's marks), seconds."""
    per: dict[int, float] = {}
    for marks in rep.marks.values():
        for key, t in marks.items():
            if len(key) == 2 and key[1] == "start" and (key[0], "end") in marks:
                per[key[0]] = max(per.get(key[0], 0.0), marks[(key[0], "end")] - t)
    return [per[k] for k in sorted(per)]


def measured_step_times(progs: dict[int, Program]) -> list[float]:
    """Per step index, the slowest rank's measured step (the programs' marks), seconds."""
    per: dict[int, float] = {}
    for p in progs.values():
        for k, (t0, t1) in _step_marks(p).items():
            per[k] = max(per.get(k, 0.0), (t1 - t0) * 1e-9)
    return [per[k] for k in sorted(per)]


def replay_at(
    progs: dict[int, Program],
    calls: dict[str, Call],
    speeds: dict[int, float],
    run_inter_bits: float | None,
    segments: dict[int, tuple[Segment, ...]] | None = None,
) -> model.Replay:
    """The measured-network replay with ``speeds`` (and per-step ``segments``) applied."""
    net = model.Network(measured=True)
    return model.replay(scaled(progs, speeds, segments), calls, net, run_inter_bits)


def excess_speed(work_s: dict[int, float], rank: int) -> float | None:
    """--without-straggler's speed for ``rank``: its work over its busiest peer's (per step);
    None when it has no peer or no work."""
    peers = [v for r, v in work_s.items() if r != rank]
    mine = work_s.get(rank)
    if not peers or not mine or max(peers) <= 0:
        return None
    return mine / max(peers)


def curve_speeds(lo: float, hi: float, n: int = CURVE_POINTS) -> list[float]:
    """Evenly spaced speeds from lo to hi, both included."""
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def what_if(
    progs: dict[int, Program],
    calls: dict[str, Call],
    speeds: dict[int, float],
    run_inter_bits: float | None,
    segments: dict[int, tuple[Segment, ...]] | None = None,
) -> dict[str, Any]:
    """One point: the predicted step (slowest rank's median) and per step, with ``speeds``
    (and per-interval ``segments``)."""
    rep = replay_at(progs, calls, speeds, run_inter_bits, segments)
    return {
        "speeds": [{"rank": r, "speed": s} for r, s in sorted(speeds.items())],
        "step_time_s": model.slowest(rep),
        "step_times_s": step_times(rep),
    }


def measured_slowest(progs: dict[int, Program]) -> float | None:
    """The measured step as the replay reports its prediction: the slowest rank's median step
    (the programs' marks), seconds."""
    meds = []
    for p in progs.values():
        d = [(t1 - t0) * 1e-9 for t0, t1 in _step_marks(p).values()]
        if d:
            meds.append(float(np.median(d)))
    return max(meds) if meds else None


def without(
    progs: dict[int, Program],
    calls: dict[str, Call],
    rank: int,
    work_s: dict[int, float],
    run_inter_bits: float | None = None,
) -> dict[str, Any] | None:
    """The step without ``rank``'s excess compute (see the module docstring): rank, speed,
    step_time_s (predicted), step_times_s, replayed_step_time_s (the same replay unchanged: the
    self-check), measured_step_time_s; None when the rank has no peer or no compute. One
    definition, for summary.json ``why.what_if`` and prediction.json ``straggler``."""
    speed = excess_speed(work_s, rank)
    if speed is None or rank not in progs:
        return None
    own = model.replay(progs, calls, model.Network(measured=True), run_inter_bits)
    segs = excess_segments(progs, rank) if len(progs) > 1 else ()
    point = what_if(progs, calls, {rank: max(1.0, speed)}, run_inter_bits, {rank: segs})
    peers = {r: v for r, v in work_s.items() if r != rank}
    return {
        "rank": rank,
        "speed": speed,
        "intervals": len(segs),
        "work_s": work_s[rank],
        "peer_work_s": max(peers.values()),
        "step_time_s": point["step_time_s"],
        "step_times_s": point["step_times_s"],
        "replayed_step_time_s": model.slowest(own),
        "measured_step_time_s": measured_slowest(progs),
    }
