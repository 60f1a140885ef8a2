"""A trace -> what the replay of tracekit.analyses.network_replay needs: per-rank programs and per-call bytes.

Per rank, the measured window becomes a sequence of items in time order (docs/predict.md):

    post  c    the rank issues call c (its ``c10d::`` call starts; a kernel's start on GPU)
    wait  c    the rank's compute thread needs c's result; measured blocked from W until R
    mark       a ProfilerStep start or end (the replay reports where they land)

Between items the rank does work at its measured pace: the replay's "work time" of a moment t
is t minus the measured blocked time before it, so compute, idle gaps and the CPU side of every
call keep their measured durations, and only the blocked time is recomputed.

Where a rank waits for call c (W, R):
1. the wait label the trace gives it: the call is posted inside a label; ``comm:<op>:<what>``
   is waited in the first ``comm:wait:<what>`` after it (DDP buckets), FSDP2's
   ``FSDP::all_gather (X)`` in the first ``FSDP::all_gather_copy_out (X)`` after it; any other
   label (``comm:recv:...``, ``FSDP::post_backward_reduce (X)``, ZeRO's synchronous gathers)
   holds its own wait, from the return of the ``c10d::`` call on. If c ends inside that wait
   region while the thread is blocked, W is where the blocked run began (not before the call
   returned) and R where it ended; if c ended before the region began, the wait cost nothing
   (W = R = the region's start).
2. otherwise, from the timeline: blocked at c's end (exposed communication or idle) means
   waited from the start of that blocked run until its end; not blocked means needed the
   moment it ended (W = R = its end: a slower network would block there).
Several calls waited in one blocked run: the run's resume lag (R minus the call's end) is kept
by the call that ended last; the others resume when it does. A call that ended before the rank
needed it (its end, as the replay ends it, before W) keeps no lag: the rank's measured block
after W is a hold from the moment it needs the call (``hold_ns``), so a later end, within the
slack, blocks nothing.

Bytes: each matched call goes through tracekit.analyses.traffic's link model (ring, tree,
pairs, by backend; the same calls frame as the ``traffic`` section). Per call the replay needs
the bytes each node sends and receives across nodes (``nic``: one full-duplex NIC per node, as
tc tbf shapes it) and the largest intra-node link's bytes.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.analyses import matching
from tracekit.analyses.traffic import link_bytes
from tracekit.analyses.traffic_section import model_calls

# a gap this short between a call's end and the thread's resumption is the same wait (ns)
_RESUME_SLACK_NS = 2_000_000
_COMM_LABEL = re.compile(r"^comm:([a-z_]+):([^:]+)")
_FSDP_GATHER = re.compile(r"^FSDP::all_gather( \(.*\))?$")


@dataclass
class Call:
    """One matched call as the replay sees it."""

    call_id: str
    op: str
    members: list[int]
    bytes: int | None
    transfer_ns: int  # measured transfer (the shortest member span)
    # rank -> measured end minus the last member's span start (>= 0): where each rank ends
    end_offset_ns: dict[int, int] = field(default_factory=dict)
    nic: dict[tuple[int, str], float] = field(default_factory=dict)  # (node, "out"|"in") -> B
    intra_bytes: float = 0.0  # bytes on the busiest intra-node link
    hops: int = 1  # sequential message steps (latency is paid per step)


@dataclass
class Item:
    kind: str  # "post" | "wait" | "mark"
    t_ns: int  # measured time (post: the call's start on the thread; wait: W; mark: the marker)
    call_id: str | None = None
    lag_ns: int = 0  # wait: measured R - the call's end on this rank (p2p: on both)
    hold_ns: int = 0  # wait: measured R - W, for a call that ended before W (lag_ns is then 0)
    span_start_ns: int = 0  # post: when its span started on the rank
    span_end_ns: int = 0  # post: when its span ended on the rank
    thread: str | None = None  # post: the runloop thread that ran it
    key: tuple | None = None  # mark: (step index, "start"|"end")


@dataclass
class Program:
    rank: int
    start_ns: int
    end_ns: int
    items: list[Item]
    blocked: list[tuple[int, int]]  # merged measured blocked intervals [W, R)
    origin_ns: int = 0  # the job's clock origin: the earliest window start of all ranks

    def work_ns(self, t: int) -> int:
        """Work time of measured time t: t - origin minus the blocked time before t (one
        origin for every rank, so that ranks that started apart stay apart)."""
        done = 0
        for a, b in self.blocked:
            if a >= t:
                break
            done += min(b, t) - a
        return t - self.origin_ns - done


def _fastest_p2p(calls: dict[str, Call]) -> None:
    """Each p2p call's transfer: the fastest of the same pair and size.

    A receive posted ahead ends when its rank waits on it, so "send posted to receive ended"
    holds whatever the receiver computed meanwhile: on the 1F1B straggler run the same 512 KiB
    activation "took" 51 us to 144 ms, and the replay kept the slowed stage's compute as a fixed
    transfer (its without-straggler step +54 % over the clean run's). Each span bounds its own
    transfer from above, and the pair's bytes take about as long every time, so the shortest
    span is the tightest bound for all of them."""
    fastest: dict[tuple[tuple[int, ...], int | None], int] = {}
    p2p = [c for c in calls.values() if c.op in matching.P2P]
    for c in p2p:
        key = (tuple(c.members), c.bytes)
        fastest[key] = min(fastest.get(key, c.transfer_ns), c.transfer_ns)
    for c in p2p:
        c.transfer_ns = fastest[(tuple(c.members), c.bytes)]


def _hops(op: str, n: int) -> int:
    if op in matching.P2P:
        return 1
    if op in ("all_reduce", "reduce_scatter"):  # gloo's reduce_scatter is a full all_reduce
        return 2 * (n - 1)
    if op in ("all_gather", "all_to_all"):
        return n - 1
    if op in ("broadcast", "reduce", "barrier"):
        return max(1, (n - 1).bit_length())
    return 1


def calls_table(coll: pl.DataFrame, nodes: dict[int, int]) -> dict[str, Call]:
    """call_id -> Call for every complete matched call, with its bytes per NIC and intra link."""
    if coll.height == 0 or "call_id" not in coll.columns:
        return {}
    frame = matching.calls_frame(coll.filter(pl.col("complete")))
    p2p = pl.col("op").is_in(matching.P2P)
    frame = frame.filter(p2p | pl.col("ranks").list.len().fill_null(0).gt(0))
    model, _ = model_calls(frame, "gloo", None)
    links = link_bytes(model.drop("group", "group_desc", "dim"), nodes)
    out: dict[str, Call] = {}
    by_index: dict[int, Call] = {}  # row of the link model -> call
    for i, c in enumerate(frame.to_dicts()):
        members = (
            sorted({int(c["src"]), int(c["dst"])}) if c["op"] in matching.P2P else list(c["ranks"])
        )
        out[c["call_id"]] = Call(
            call_id=c["call_id"],
            op=c["op"],
            members=members,
            bytes=c["bytes"],
            transfer_ns=int(c["transfer_ns"] or 0),
            hops=_hops(c["op"], len(members)),
        )
        by_index[i] = out[c["call_id"]]
    # p2p: a span lasts from isend/irecv to wait(), and receives are posted ahead, so the
    # shorter span still holds compute; the transfer is from the send's post to the receive
    pairs = (
        coll.filter(pl.col("complete") & pl.col("op").is_in(matching.P2P))
        .group_by("call_id")
        .agg(
            pl.col("start_ns").filter(pl.col("op") == "send").min().alias("s"),
            pl.col("end_ns").filter(pl.col("op") == "recv").max().alias("e"),
        )
    )
    for r in pairs.iter_rows(named=True):
        call = out.get(r["call_id"])
        if call is not None and r["s"] is not None and r["e"] is not None:
            call.transfer_ns = int(min(call.transfer_ns, max(0, r["e"] - r["s"])))
    _fastest_p2p(out)
    # collectives end on each rank as measured; a p2p transfer ends at once on both (the send's
    # span lasts until the sender's wait(), which is no end of the transfer)
    last = (
        coll.filter(
            pl.col("complete")
            & pl.col("call_id").is_in(list(out))
            & ~pl.col("op").is_in(matching.P2P)
        )
        .with_columns(pl.col("start_ns").max().over("call_id").alias("_s"))
        .select("call_id", "rank", (pl.col("end_ns") - pl.col("_s")).clip(0).alias("off"))
    )
    for r in last.iter_rows(named=True):
        out[r["call_id"]].end_offset_ns[int(r["rank"])] = int(r["off"])
    for r in links.to_dicts():
        call = by_index.get(r["call_index"])
        a, b = nodes.get(r["src"]), nodes.get(r["dst"])
        if call is None or a is None or b is None:
            continue
        if a == b:
            call.intra_bytes = max(call.intra_bytes, r["bytes"])
        else:
            call.nic[(a, "out")] = call.nic.get((a, "out"), 0.0) + r["bytes"]
            call.nic[(b, "in")] = call.nic.get((b, "in"), 0.0) + r["bytes"]
    return out


def _compute_thread_labels(events: pl.DataFrame) -> pl.DataFrame:
    """user_annotation labels on each rank's ProfilerStep thread: rank, name, start_ns, end_ns."""
    cpu = events.filter(pl.col("device") == "cpu").select(
        "rank", "pid", "tid", "cat", "name", "start_ns", "end_ns"
    )
    main = (
        cpu.filter(pl.col("name").str.starts_with("ProfilerStep#"))
        .group_by("rank")
        .agg(pl.col("pid").first(), pl.col("tid").first())
    )
    return (
        cpu.filter(pl.col("cat") == "user_annotation")
        .join(main, on=["rank", "pid", "tid"])
        .select("rank", "name", "start_ns", "end_ns")
        .sort("rank", "start_ns")
    )


class _Labels:
    """One rank's labels, for the innermost-containing and first-named-after look-ups."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.starts = [r["start_ns"] for r in rows]

    def innermost(self, t: int) -> dict[str, Any] | None:
        best = None
        for r in self.rows[: bisect.bisect_right(self.starts, t)]:
            if r["end_ns"] >= t and (best is None or r["start_ns"] >= best["start_ns"]):
                if not r["name"].startswith("ProfilerStep#"):
                    best = r
        return best

    def first_after(self, t: int, name: str) -> dict[str, Any] | None:
        for r in self.rows[bisect.bisect_left(self.starts, t) :]:
            if r["name"] == name:
                return r
        return None


def _wait_region(labels: _Labels, post: int, ret: int) -> tuple[int, int] | None:
    """[start, end] of where the rank waits for a call posted at `post` (returned at `ret`)."""
    lab = labels.innermost(post)
    if lab is None:
        return None
    name = lab["name"]
    m = _COMM_LABEL.match(name)
    if m and m[1] != "wait":
        w = labels.first_after(post, f"comm:wait:{m[2]}")
        if w is not None:
            return w["start_ns"], w["end_ns"]
    g = _FSDP_GATHER.match(name)
    if g:
        w = labels.first_after(post, f"FSDP::all_gather_copy_out{g[1] or ''}")
        if w is not None:
            return w["start_ns"], w["end_ns"]
    return max(ret, lab["start_ns"]), lab["end_ns"]  # the label holds its own wait


class _Blocked:
    """One rank's blocked runs (timeline states other than compute/overlap), merged."""

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs = runs
        self.starts = [a for a, _ in runs]

    def at(self, t: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self.starts, t) - 1
        if i >= 0 and self.runs[i][0] <= t <= self.runs[i][1]:
            return self.runs[i]
        return None


def _blocked_runs(timeline: pl.DataFrame) -> dict[int, _Blocked]:
    t = (
        timeline.sort("rank", "start_ns")
        .with_columns(pl.col("state").is_in(["compute", "overlap"]).not_().alias("b"))
        .with_columns(
            (pl.col("b") != pl.col("b").shift(1).over("rank")).fill_null(True).cum_sum().alias("g")
        )
        .filter(pl.col("b"))
        .group_by("rank", "g")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .sort("rank", "start_ns")
    )
    out: dict[int, list[tuple[int, int]]] = {}
    for r in t.iter_rows(named=True):
        out.setdefault(int(r["rank"]), []).append((r["start_ns"], r["end_ns"]))
    return {k: _Blocked(v) for k, v in out.items()}


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def programs(
    events: pl.DataFrame,
    timeline: pl.DataFrame,
    coll: pl.DataFrame,
    markers: pl.DataFrame,
    windows: pl.DataFrame,
    calls: dict[str, Call],
    ops: pl.DataFrame | None = None,
) -> dict[int, Program]:
    """rank -> Program (see the module docstring). ``ops`` (the ``pipeline_ops`` frame) adds
    marks keyed ("op", step, i, "start"|"end") at each F/B/W op."""
    labels_by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in _compute_thread_labels(events).iter_rows(named=True):
        labels_by_rank.setdefault(int(r["rank"]), []).append(r)
    blocked_by_rank = _blocked_runs(timeline)
    rows = coll.filter(pl.col("call_id").is_in(list(calls))).sort("rank", "start_ns")
    # where the replay ends a call with no per-rank ends (p2p): last span start + transfer
    matched_end = {
        r["call_id"]: r["s"] + calls[r["call_id"]].transfer_ns
        for r in rows.group_by("call_id")
        .agg(pl.col("start_ns").max().alias("s"))
        .iter_rows(named=True)
    }
    out: dict[int, Program] = {}
    for w in windows.iter_rows(named=True):
        rank, w0, w1 = int(w["rank"]), w["start_ns"], w["end_ns"]
        if w0 is None or w1 is None:
            continue
        labels = _Labels(labels_by_rank.get(rank, []))
        blocked = blocked_by_rank.get(rank, _Blocked([]))
        items: list[Item] = []
        waits: list[tuple[int, int, int, str]] = []  # W, R, end, call_id
        for c in rows.filter(pl.col("rank") == rank).iter_rows(named=True):
            post = c["call_start_ns"] if c["call_start_ns"] is not None else c["start_ns"]
            ret = c["call_end_ns"] if c["call_end_ns"] is not None else post
            s, e = c["start_ns"], c["end_ns"]
            items.append(
                Item(
                    "post",
                    post,
                    c["call_id"],
                    span_start_ns=s,
                    span_end_ns=e,
                    thread=c.get("thread"),
                )
            )
            region = _wait_region(labels, post, ret)
            run = blocked.at(e)
            if ret >= e:  # the call itself blocked until its span ended
                wt, rt = post, ret
            elif region is not None and e < region[0]:
                wt, rt = region[0], region[0]  # done before it was needed
            elif region is not None and e <= region[1] + _RESUME_SLACK_NS and run is not None:
                wt, rt = max(run[0], region[0], ret), max(run[1], e)
            elif run is not None:
                wt, rt = max(run[0], ret), max(run[1], e)
            else:
                wt, rt = max(e, ret), max(e, ret)  # needed the moment it ended
            waits.append((min(wt, rt), rt, e, c["call_id"]))
        # one blocked run, several calls: the one that ended last keeps the resume lag
        last_end: dict[int, int] = {}
        for _, rt, e, _ in waits:
            last_end[rt] = max(last_end.get(rt, e), e)
        for wt, rt, e, cid in waits:
            own = e if calls[cid].end_offset_ns else matched_end.get(cid, e)
            # a call that ended (as the replay ends it) before it was needed: the rank's block
            # after W is held from the moment it needs the call (hold), not from the call's end,
            # or a later end (a slower network, a faster peer) would block it for all its slack
            last = e == last_end[rt]
            lag = rt - own if last and own >= wt else 0
            hold = rt - wt if last and own < wt else 0
            items.append(Item("wait", wt, cid, lag_ns=lag, hold_ns=hold))
        steps = markers.filter(pl.col("rank") == rank).sort("start_ns")
        for i, m in enumerate(steps.iter_rows(named=True)):
            if m["start_ns"] >= w0 and m["end_ns"] <= w1:
                items.append(Item("mark", m["start_ns"], key=(i, "start")))
                items.append(Item("mark", m["end_ns"], key=(i, "end")))
        if ops is not None and ops.height:
            mine = ops.filter(pl.col("rank") == rank).sort("start_ns")
            for i, o in enumerate(mine.iter_rows(named=True)):
                items.append(Item("mark", o["start_ns"], key=("op", o["step"], i, "start")))
                items.append(Item("mark", o["end_ns"], key=("op", o["step"], i, "end")))
        order = {"post": 0, "mark": 1, "wait": 2}
        items.sort(key=lambda it: (it.t_ns, order[it.kind]))
        spans = _merge([(wt, rt) for wt, rt, _, _ in waits if rt > wt])
        out[rank] = Program(rank, w0, w1, items, spans)
    return common_origin(out)


def common_origin(progs: dict[int, Program]) -> dict[int, Program]:
    """Every rank's work time counted from the earliest window start (ranks' windows start at
    their first ProfilerStep, tens of ms apart: counting each from its own start moved
    their calls against each other)."""
    origin = min((p.start_ns for p in progs.values()), default=0)
    for p in progs.values():
        p.origin_ns = origin
    return progs
