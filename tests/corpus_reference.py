"""Per-rank numbers recomputed from the trace JSON, independently of tracekit's code.

Plain Python over the files (gzip + json) and interval lists: none of tracekit's code, no
polars. Two references:

:func:`breakdown`, HolisticTraceAnalysis's temporal breakdown in percent, with HTA's definitions
as docs/corpus-sources.md states them:

- device events: complete (``ph: "X"``) events whose category, compared case-insensitively, is
  ``kernel``, ``gpu_memcpy``, ``gpu_memset`` or Kineto's older ``Memcpy`` / ``Memset``, or MTIA's
  ``mtia_ccp_events``; also ``cuda_sync`` events on a stream (HTA keeps every event whose
  ``args.stream`` is not -1: a Stream Sync counts, an Event Sync, stream -1, does not);
- communication kernels: names starting with ``nccl`` / ``rccl`` (also after ``void ``), or
  holding ``ncclDevKernel`` / ``ncclKernel``; memory: the memcpy/memset categories and MTIA's
  ``dma*`` commands; MTIA's ``event_wait`` / ``event_record`` are stream synchronisation;
  compute: every other device event;
- span = last device event end - first device event start; idle = span - |union of all device
  events|; compute = |union of compute events|;
- window: with two or more distinct ``ProfilerStep#N`` markers, only device events launched
  (``args.correlation``) by host events that start before the last marker starts.

:func:`rank_seconds`, every field of the summary's ``ranks[]`` breakdown (span, compute, comm,
overlap, exposed comm, other, idle) of a job's traces, with the definitions of docs/metrics.md
"Per rank": GPU ranks by the device rules above plus the host's ``gloo:*`` spans as
communication; CPU ranks from ``cpu_op`` events on the compute threads, communication calls,
``gloo:*`` spans (a p2p span paired with its peer counts only its transfer and blocked wait)
and communication labels. Each set is a list of disjoint intervals; unions, intersections and
differences are merges of sorted lists (tracekit sweeps counters over boundaries instead), and
idle is the window minus the union of everything the rank did in it.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"}
_MEMORY_CATS = {"gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_COMM = re.compile(r"^(void\s+)?(nccl|rccl)|ncclDevKernel|ncclKernel", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep#\d+$")


def load(path: Path) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


Intervals = list[tuple[float, float]]


def merged(intervals: Iterable[tuple[float, float]]) -> Intervals:
    """Sorted disjoint intervals covering exactly what the given ones cover (empty ones dropped)."""
    out: Intervals = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in merged(intervals))


def intersect(xs: Intervals, ys: Intervals) -> Intervals:
    """Of two merged lists: what both cover."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(xs: Intervals, ys: Intervals) -> Intervals:
    """Of two merged lists: what xs covers and ys does not."""
    out, j = [], 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > a:
                out.append((a, ys[k][0]))
            a = max(a, ys[k][1])
            k += 1
        if b > a:
            out.append((a, b))
    return out


@dataclass
class Breakdown:
    rank: int | None
    device_events: int
    span_us: float
    idle_pct: float | None
    compute_pct: float | None
    steps: int  # distinct ProfilerStep markers


def _kind(cat: str, name: str) -> str:
    if cat in _MEMORY_CATS:
        return "memory"
    if cat == "cuda_sync":
        return "sync"
    if cat == "mtia_ccp_events":
        if name.startswith("dma"):
            return "memory"
        if name in ("event_wait", "event_record"):
            return "sync"
        return "compute"
    return "communication" if _COMM.search(name) else "compute"


def _split(events: Iterable[dict]) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    """(device, host) complete events with a duration, each with its lower-cased category."""
    device, host = [], []
    for e in events:
        if e.get("ph") != "X" or not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
            continue
        cat = str(e.get("cat", "")).lower()
        if cat == "cuda_sync":  # on the device's pid: never a host event
            if (e.get("args") or {}).get("stream", -1) != -1:
                device.append((cat, e))
            continue
        (device if cat in _DEVICE else host).append((cat, e))
    return device, host


def _launched_before_last_step(
    device: list[tuple[str, dict]], host: list[tuple[str, dict]], ts: str = "ts"
) -> tuple[list[tuple[str, dict]], int, float | None]:
    """HTA's window: (device events kept, distinct step markers, the last marker's start)."""
    # markers on the host: the device's copies of them (gpu_user_annotation) start later
    markers = [e for c, e in host if c != "gpu_user_annotation" and _STEP.match(_name(e))]
    steps = {e["name"] for e in markers}
    if len(steps) < 2:
        return device, len(steps), None
    last = max(e[ts] for e in markers)
    launched = {
        (e.get("args") or {}).get("correlation")
        for _, e in host
        if e[ts] < last and (e.get("args") or {}).get("correlation") is not None
    }
    kept = [(c, e) for c, e in device if (e.get("args") or {}).get("correlation") in launched]
    return kept, len(steps), last


def breakdown(trace: dict) -> Breakdown:
    """Idle and compute in percent of the device span (None without device events)."""
    device, host = _split(trace.get("traceEvents", []))
    device, steps, _ = _launched_before_last_step(device, host)
    dist = trace.get("distributedInfo") or {}
    rank = dist.get("rank") if isinstance(dist, dict) else None
    if not device:
        return Breakdown(rank, 0, 0.0, None, None, steps)
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for _, e in device]
    compute = [
        s for (c, e), s in zip(device, spans) if _kind(c, str(e.get("name", ""))) == "compute"
    ]
    span = max(b for _, b in spans) - min(a for a, _ in spans)
    if span <= 0:
        return Breakdown(rank, len(device), span, None, None, steps)
    idle = span - length(spans)
    return Breakdown(
        rank, len(device), span, 100 * idle / span, 100 * length(compute) / span, steps
    )


# --- every ranks[] field, GPU and CPU ranks (docs/metrics.md "Per rank") -------------------------

COMM_CALL = re.compile(
    r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|gloo:)|^record_param_comms$"
)
WAIT_LABEL = re.compile(
    r"^comm:|^FSDP::(all_gather|pre_forward|pre_backward|post_backward_reduce|post_backward_rs_wait)"
)
P2P = ("gloo:send", "gloo:recv")
RUNLOOP = "pt_gloo_runloop"


def _ns(base: int, ts: float, dur: float) -> tuple[int, int]:
    """A Kineto time (microseconds, a float) in integer ns: whole microseconds x 1000 plus the
    rounded fraction, the duration rounded the same way."""
    whole = math.floor(ts)
    start = base + whole * 1000 + round((ts - whole) * 1000)
    return start, start + round(dur * 1000)


@dataclass
class _Rank:
    rank: int
    device: list[tuple[str, dict]]  # (category, event), events with s / e in ns and their thread
    host: list[tuple[str, dict]]
    runloop: set[tuple[str, str]]  # (pid, tid) of gloo runloop threads

    def ops(self) -> list[dict]:
        """cpu_op events on the compute threads."""
        return [e for c, e in self.host if c == "cpu_op" and e["thread"] not in self.runloop]

    def gloo(self) -> list[dict]:
        """gloo:* spans, on any thread."""
        return [e for c, e in self.host if c == "user_annotation" and _name(e).startswith("gloo:")]


def _name(e: dict) -> str:
    return str(e.get("name", ""))


def _rank_of(trace: dict) -> _Rank:
    base = int(trace.get("baseTimeNanoseconds") or 0)
    names: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(str(e.get("pid")), str(e.get("tid")))].append(str(e["args"].get("name", "")))
    device, host = _split(trace["traceEvents"])
    for _, e in device + host:
        e["s"], e["e"] = _ns(base, e["ts"], e["dur"])
        e["thread"] = (str(e.get("pid")), str(e.get("tid")))
    # runloop threads: named so, or carrying gloo collective spans and no cpu_op
    runloop = {t for t, ns in names.items() if any(RUNLOOP in n for n in ns)}
    runloop |= {
        e["thread"]
        for c, e in host
        if c in ("cpu_op", "user_annotation")
        and _name(e).startswith("gloo:")
        and _name(e) not in P2P
    } - {e["thread"] for c, e in host if c == "cpu_op"}
    rank = int((trace.get("distributedInfo") or {}).get("rank", 0))  # one rank: 0, as tracekit
    return _Rank(rank, device, host, runloop)


def _p2p_spans(ranks: dict[int, _Rank]) -> dict[int, list[dict]]:
    """Each rank's gloo p2p spans on its calling threads, with ``transfer`` where its peer's span
    is in the traces: the k-th send a -> b is the k-th receive on b from a, the receives' order
    shifted when a trace starts with messages in flight (the shift with the fewest receives that
    end before their send was posted, then the most pairs, then the smallest)."""
    out: dict[int, list[dict]] = {}
    for rank, r in ranks.items():
        calls = [
            e for c, e in r.host if c == "cpu_op" and e["name"] in ("c10d::send", "c10d::recv_")
        ]
        spans = []
        for e in sorted(r.gloo(), key=lambda e: e["s"]):
            if e["name"] in P2P and e["thread"] not in r.runloop:
                # the peer: third concrete input of the c10d::send / recv_ that posted the span
                call = max(
                    (k for k in calls if k["thread"] == e["thread"] and k["s"] <= e["s"]),
                    key=lambda k: k["s"],
                    default=None,
                )
                if call is not None:
                    e["peer"] = int(call["args"]["Concrete Inputs"][2])
                    e["posted"] = call["s"]
                spans.append(e)
        out[rank] = spans
    sends, recvs = defaultdict(list), defaultdict(list)
    for rank, spans in out.items():
        for sp in (sp for sp in spans if "peer" in sp):  # without its call, no peer: whole
            if sp["name"] == "gloo:send":
                sends[(rank, sp["peer"])].append(sp)
            else:
                recvs[(sp["peer"], rank)].append(sp)
    for pair, ss in sends.items():
        rs = recvs.get(pair, [])

        def pairs(k: int, ss: list = ss, rs: list = rs) -> list[tuple[dict, dict]]:
            return [(ss[j + k], r) for j, r in enumerate(rs) if 0 <= j + k < len(ss)]

        shift = min(
            range(-len(rs) + 1, len(ss)),
            key=lambda k: (sum(r["e"] < s["posted"] for s, r in pairs(k)), -len(pairs(k)), abs(k)),
        )
        for snd, rcv in pairs(shift):
            rcv["transfer"] = (max(rcv["s"], snd["s"]), rcv["e"])
            snd["transfer"] = (max(snd["s"], rcv["s"]), min(snd["e"], rcv["e"]))
    return out


@dataclass
class _Comm:
    """A rank's gloo communication: spans counted whole, and of the paired p2p spans their
    transfer and their blocked wait (the tail after the last op that the span's thread started
    before the span's end)."""

    whole: list[dict]
    transfer: Intervals
    blocked: Intervals

    @staticmethod
    def of(r: _Rank, p2p: list[dict]) -> _Comm:
        paired = {id(sp) for sp in p2p if "transfer" in sp}
        by_thread: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for o in r.ops():
            by_thread[o["thread"]].append(o)
        transfer, blocked = [], []
        for sp in p2p:
            if id(sp) in paired:
                transfer.append(sp["transfer"])
                ops = by_thread[sp["thread"]]
                reach = max((o["e"] for o in ops if o["s"] < sp["e"]), default=sp["s"])
                blocked.append((max(sp["s"], reach), sp["e"]))
        whole = [e for e in r.gloo() if id(e) not in paired]
        return _Comm(whole, transfer, blocked)

    def intervals(self) -> Intervals:
        return [(e["s"], e["e"]) for e in self.whole] + self.transfer + self.blocked


def _step_markers(r: _Rank) -> list[dict]:
    first: dict[str, dict] = {}
    for c, e in r.host:
        if c != "gpu_user_annotation" and _STEP.match(_name(e)):
            first.setdefault(e["name"], e)
    return list(first.values())


def _clip(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> Intervals:
    return merged((max(a, lo), min(b, hi)) for a, b in intervals)


def _spans(events: Iterable[dict]) -> Intervals:
    return merged((e["s"], e["e"]) for e in events)


# window start, window end, compute, communication, other
Sets = tuple[float, float, Intervals, Intervals, Intervals]


def _gpu_sets(r: _Rank, gloo: _Comm) -> Sets:
    """GPU rank: device events launched before the last step, and the host's gloo spans."""
    device, _, last = _launched_before_last_step(r.device, r.host, ts="s")
    host = gloo.intervals()
    if last is not None:  # host spans count when they start before the last step
        host = [(a, b) for a, b in host if a < last]
    kinds: dict[str, list] = defaultdict(list)
    for c, e in device:
        kinds[_kind(c, _name(e))].append((e["s"], e["e"]))
    comm = merged(kinds["communication"] + host)
    compute, other = merged(kinds["compute"]), merged(kinds["memory"] + kinds["sync"])
    every = compute + comm + other
    lo, hi = min(a for a, _ in every), max(b for _, b in every)
    return lo, hi, compute, comm, other


def _cpu_sets(r: _Rank, gloo: _Comm) -> Sets:
    """CPU rank: compute ops minus communication calls and waits; gloo spans and calls."""
    ops = r.ops()
    calls = [e for c, e in r.host if c == "cpu_op" and COMM_CALL.search(_name(e))]
    compute_ops = [e for e in ops if not COMM_CALL.search(_name(e))]
    comm = _spans(calls) + gloo.intervals()
    markers = _step_markers(r)
    if markers:
        lo, hi = min(e["s"] for e in markers), max(e["e"] for e in markers)
    else:
        every = [(e["s"], e["e"]) for c, e in r.host if c == "cpu_op"] + comm
        lo, hi = min(a for a, _ in every), max(b for _, b in every)
    # waiting: inside a communication label, or a gloo span counted whole, on a compute thread,
    # under no op nested in that label
    labels: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for c, e in r.host:
        if c == "user_annotation" and e["thread"] not in r.runloop and WAIT_LABEL.search(_name(e)):
            labels[e["thread"]].append(e)
    for e in gloo.whole:
        if e["thread"] not in r.runloop:
            labels[e["thread"]].append(e)
    nested = [
        o
        for o in compute_ops
        if any(w["s"] <= o["s"] and o["e"] <= w["e"] for w in labels[o["thread"]])
    ]
    waiting = subtract(_spans(e for ls in labels.values() for e in ls), _spans(nested))
    compute = subtract(subtract(_spans(compute_ops), _spans(calls)), waiting)
    return lo, hi, _clip(compute, lo, hi), _clip(comm, lo, hi), []


def rank_seconds(paths: Iterable[Path]) -> dict[int, dict[str, float]]:
    """rank -> the ranks[] breakdown (span_s, compute_s, comm_s, overlap_s, exposed_comm_s,
    other_s, idle_s) and the p2p parts (transfer_s, blocked_s) of the job whose traces, one per
    rank, these are."""
    ranks = {r.rank: r for r in (_rank_of(load(p)) for p in paths)}
    p2p = _p2p_spans(ranks)
    out = {}
    for rank, r in ranks.items():
        gloo = _Comm.of(r, p2p[rank])
        gpu = any(c in _DEVICE for c, _ in r.device)
        lo, hi, compute, comm, other = (_gpu_sets if gpu else _cpu_sets)(r, gloo)
        busy = merged(compute + comm + other)
        overlap = length(intersect(compute, comm))
        out[rank] = {
            "span_s": (hi - lo) * 1e-9,
            "compute_s": length(compute) * 1e-9,
            "comm_s": length(comm) * 1e-9,
            "overlap_s": overlap * 1e-9,
            "exposed_comm_s": (length(comm) - overlap) * 1e-9,
            "other_s": length(subtract(other, merged(compute + comm))) * 1e-9,
            "idle_s": (hi - lo - length(busy)) * 1e-9,
            "transfer_s": length(_clip(gloo.transfer, lo, hi)) * 1e-9,
            "blocked_s": length(_clip(gloo.blocked, lo, hi)) * 1e-9,
        }
    return out


FIELDS = ("span_s", "compute_s", "comm_s", "overlap_s", "exposed_comm_s", "other_s", "idle_s")


def _field(row: Any, name: str) -> Any:
    """A field of a summary ranks[] row: a tracekit.summary.Rank, or a dict (a frame's row)."""
    return row[name] if isinstance(row, dict) else getattr(row, name)


def differences(
    ranks: Iterable[Any], reference: dict[int, dict[str, float]], tol_s: float = 1e-9
) -> list[str]:
    """One line per summary ranks[] field further than tol_s from the reference's, and per rank
    found on one side only; empty when tracekit and the reference agree."""
    got = {_field(r, "rank"): r for r in ranks}
    out = [f"rank {r}: only in {'tracekit' if r in got else 'the reference'}" for r in
           sorted(got.keys() ^ reference.keys())]  # fmt: skip
    for rank in sorted(got.keys() & reference.keys()):
        for f in FIELDS:
            g, want = _field(got[rank], f), _field(reference[rank], f)
            if not abs(g - want) <= tol_s:
                out.append(f"rank {rank} {f}: {g:.9f} s, from the events {want:.9f} s")
    return out
