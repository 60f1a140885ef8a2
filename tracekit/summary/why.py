"""summary.json ``why``: wait states, their root causes and the critical path across ranks.

Scalasca's wait-state patterns (Wait at N x N, Late Sender, Late Receiver, Late Broadcast,
Early Reduce), Böhme et al.'s delay analysis (ICPP 2010: "Identifying the root causes of wait
states in large-scale parallel applications") and critical-path profile (IPDPS 2012).
"""

from __future__ import annotations

from typing import Annotated

from tracekit.summary.base import M, Record

_WAIT = (
    "Scalasca wait states: per member of a complete call, clip(last arrival - its start, 0, "
    "duration); the last arrival is the latest member's start (a send: when it was posted)"
)


class WaitRank(Record):
    """One rank: its waits, the waits it caused, and its time with waiting as its own state
    (compute + transfer_s + waiting_s + other + idle = span)."""

    rank: Annotated[int, M("the rank")]
    span_s: Annotated[float, M("its window, seconds (as `ranks[].span_s`)")]
    compute_s: Annotated[float, M("compute, seconds (as `ranks[].compute_s`)")]
    transfer_s: Annotated[
        float,
        M(
            "exposed communication that is not waiting: `ranks[].exposed_comm_s` minus "
            "waiting_s, seconds (bytes moving, not under compute)"
        ),
    ]
    waiting_s: Annotated[
        float,
        M(
            "waiting on peers: exposed communication inside the rank's wait intervals "
            "(" + _WAIT + "), seconds"
        ),
    ]
    other_s: Annotated[float, M("memcpy / memset / sync, seconds (as `ranks[].other_s`)")]
    idle_s: Annotated[float, M("none of the above, seconds (as `ranks[].idle_s`)")]
    comm_transfer_s: Annotated[
        float,
        M("communication less waiting, overlapped or not: `ranks[].comm_s` - waiting_s, seconds"),
    ]
    waited_s: Annotated[
        float, M("its waits summed over its calls (under compute or not), seconds (Scalasca)")
    ]
    caused_s: Annotated[
        float,
        M("the waits of others at calls where this rank arrived last, seconds (Scalasca)"),
    ]


class WaitPair(Record):
    """One cell of the who-waits-on-whom matrix."""

    waiter: Annotated[int, M("the rank that waited")]
    cause: Annotated[int, M("the rank that arrived last")]
    wait_s: Annotated[
        float,
        M(
            "the time the waiter was blocked waiting at calls where cause arrived last, each "
            "instant once (a call's wait cut to the waiter's `waiting` state and to what no "
            "earlier call's wait already holds, as the root causes count it), seconds; at most "
            "the waiter's `waiting_s`"
        ),
    ]
    calls: Annotated[int, M("those calls with some of that time")]


class WaitPattern(Record):
    """Waits per Scalasca pattern."""

    pattern: Annotated[
        str,
        M(
            "`wait_at_nxn` (all_reduce, all_gather, reduce_scatter, all_to_all, barrier), "
            "`late_broadcast`, `early_reduce`, `late_sender` (a recv waits for its send), "
            "`late_receiver` (a send waits for its recv)"
        ),
    ]
    wait_s: Annotated[float, M("waits of that pattern, seconds")]
    rows: Annotated[int, M("member rows of that pattern with a wait")]


class WaitStates(Record):
    """Wait states of every complete matched call (frame `wait_states.parquet`)."""

    calls: Annotated[int, M("complete calls with every member in the window")]
    wait_s: Annotated[float, M("waits summed over every member row, seconds (" + _WAIT + ")")]
    transfer_s: Annotated[
        float,
        M(
            "per call max(0, earliest member end - last arrival), summed over calls, seconds: the "
            "bytes moving once everyone is there"
        ),
    ]
    per_rank: Annotated[list[WaitRank], M("one row per rank")]
    pairs: Annotated[list[WaitPair], M("who waits on whom, most first (frame `wait_matrix`)")]
    patterns: Annotated[list[WaitPattern], M("waits per Scalasca pattern, most first")]


class Cause(Record):
    """A root cause: a rank and what it did, and the waits charged to it."""

    rank: Annotated[int, M("the delaying rank (after following chains to the original cause)")]
    what: Annotated[
        str,
        M(
            "an op name (its compute in excess of the waiting peer's), or a state: `transfer`, "
            "`other`, `idle`, `compute` (no op named), `waiting` (a wait whose cause is not "
            "traced), `late start` (what the cause's excess does not explain: it left the previous "
            "shared call later); in the frame also `before trace` (the part of a wait before the "
            "cause's trace began; see before_trace_s)"
        ),
    ]
    kind: Annotated[str, M("`op` or `state`")]
    label: Annotated[
        str | None,
        M(
            "an op's phase: the innermost tracekit label open when it ran (`forward`, "
            "`backward`, `optimizer`, `zero_grad`, or a pipeline op `F:s<stage>` / `B:s<stage>` / "
            "`W:s<stage>`); null for a state or an op outside every phase"
        ),
    ]
    cost_s: Annotated[float, M("the waits charged to it, seconds (Böhme et al. ICPP 2010)")]


class CauseRank(Record):
    """The waits charged to one rank."""

    rank: Annotated[int, M("the rank")]
    cost_s: Annotated[
        float,
        M("waits charged to this rank as root cause, direct and propagated, seconds (Böhme 2010)"),
    ]
    share: Annotated[float, M("cost_s / root_causes.wait_s")]


class CauseLabel(Record):
    """The waits charged to one rank's ops in one phase (tracekit's labels)."""

    rank: Annotated[int, M("the delaying rank")]
    label: Annotated[str, M("the phase, as `top[].label`")]
    cost_s: Annotated[float, M("the waits charged to its ops in that phase, seconds")]


class RootCauses(Record):
    """Böhme et al.'s delay analysis: each wait charged to the work that delayed its cause
    (frame `root_causes.parquet`)."""

    wait_s: Annotated[
        float,
        M(
            "waits on another rank analysed, seconds: each wait cut to the time its rank was "
            "blocked (its `waiting` state), each instant once where concurrent calls' waits "
            "overlap (DP buckets, prefetched gathers), so a rank's share is its `waiting_s`"
        ),
    ]
    direct_s: Annotated[
        float,
        M(
            "the part charged to the last arriver itself (its excess work, its late start, the "
            "part before its trace), seconds (Böhme 2010)"
        ),
    ]
    propagated_s: Annotated[
        float,
        M(
            "the part on the last arriver's own waiting, passed to the causes of those waits, "
            "seconds (Böhme 2010's propagating wait states)"
        ),
    ]
    before_trace_s: Annotated[
        float,
        M(
            "the part of the waits that lies before the awaited rank's trace began (profilers "
            "started apart), seconds: its cause is not in the trace, so it is in no rank's cost "
            "(per_rank, top); per_rank's costs plus this are wait_s"
        ),
    ]
    per_rank: Annotated[
        list[CauseRank], M("cost per root-cause rank, most first (`before trace` left out)")
    ]
    top: Annotated[
        list[Cause],
        M("the 10 largest causes (rank, op or state), most first (`before trace` left out)"),
    ]
    by_label: Annotated[
        list[CauseLabel],
        M(
            "the ops' costs summed per rank and phase label (ops outside a phase left out), most first"
        ),
    ]


class PathRank(Record):
    """A rank's share of the critical path."""

    rank: Annotated[int, M("the rank")]
    seconds: Annotated[float, M("its time on the path, summed over steps")]
    share: Annotated[float, M("seconds / critical_path.length_s")]


class PathState(Record):
    """A state's share of the critical path."""

    state: Annotated[str, M("`compute`, `transfer`, `waiting`, `other` or `idle`")]
    seconds: Annotated[float, M("time on the path in that state, summed over steps")]
    share: Annotated[float, M("seconds / critical_path.length_s")]


class PathOp(Record):
    """An op on the critical path."""

    rank: Annotated[int, M("its rank")]
    name: Annotated[str, M("the op (a top-level compute event)")]
    seconds: Annotated[float, M("its time on the path, summed over steps")]


class CriticalPath(Record):
    """Böhme et al.'s critical path (IPDPS 2012) of each step across ranks (frame
    `critical_path.parquet`)."""

    steps: Annotated[int, M("steps walked (the window as one when there are no step markers)")]
    length_s: Annotated[float, M("the paths' lengths summed over steps, seconds")]
    step_s: Annotated[float | None, M("median length of one step's path, seconds")]
    per_rank: Annotated[list[PathRank], M("time on the path per rank, most first")]
    per_state: Annotated[list[PathState], M("time on the path per state")]
    top_ops: Annotated[list[PathOp], M("the 10 ops with most time on the path")]
    note: Annotated[
        str | None, M("`one rank: no cross-rank waits` for a single-rank trace, else null")
    ]


class WhatIf(Record):
    """The step without the top cause's excess work: the network replay at measured transfers
    with that rank's work, between synchronisation points, set to its busiest peer's
    (tracekit.analyses.straggler_replay;
    `tracekit predict --without-straggler` gives the same numbers)."""

    rank: Annotated[int, M("the rank whose excess is removed: why.top_cause")]
    speed: Annotated[
        float,
        M(
            "work_s / peer_work_s: the replay runs the rank's work this many times faster "
            "(not at all when under 1)"
        ),
    ]
    work_s: Annotated[
        float,
        M(
            "its work per profiled step: compute + other + idle (the span less waiting and "
            "exposed transfer: what the replay runs at measured pace), seconds"
        ),
    ]
    peer_work_s: Annotated[float, M("the busiest other rank's work per step, seconds")]
    step_s: Annotated[
        float | None,
        M("predicted step without the excess: the slowest rank's median replayed step, seconds"),
    ]
    replayed_step_s: Annotated[
        float | None,
        M("the same replay with nothing removed (its self-check against measured_step_s), seconds"),
    ]
    measured_step_s: Annotated[
        float | None, M("the slowest rank's median measured step in the window, seconds")
    ]


class Why(Record):
    """Why the step takes the time it does: wait states, root causes, critical path."""

    diagnosis: Annotated[
        list[str],
        M("a few lines (`tracekit why`): the top cause first, the step, the path, the top waits"),
    ]
    top_cause: Annotated[
        int | None,
        M(
            "the rank charged with most waits (root_causes.per_rank[0]); null when none, or when "
            "its cost is under 10 % of the mean rank span (no rank holds the others up)"
        ),
    ]
    wait_states: Annotated[WaitStates, M("the waits of every complete call")]
    root_causes: Annotated[RootCauses, M("what caused them")]
    critical_path: Annotated[CriticalPath | None, M("the path across ranks; null without a window")]
    what_if: Annotated[
        WhatIf | None,
        M(
            "the straggler what-if: the step without the top cause's excess; null without a "
            "top cause, or when the replay cannot run (a warning says why)"
        ),
    ] = None
