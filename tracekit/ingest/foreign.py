"""Traces a user brings: which files of a folder form one job, and what they do not say.

A folder of Kineto traces from someone else's cluster may hold more than one job's worth:

- **Profiling cycles**: ``tensorboard_trace_handler`` with ``schedule(repeat=N)`` writes one
  ``<worker>.<timestamp>.pt.trace.json[.gz]`` per cycle, all claiming the same rank. Files of
  one rank from one process (same host and pid) that do not overlap in time are cycles: the
  latest is used, with a warning naming the ignored files.
- **Two traces claiming one rank at the same time** (their time ranges overlap): an error
  naming both; nothing can tell which one is right.
- **Mixed jobs**: one rank's traces from different processes (another run of the job), traces
  that disagree on ``distributedInfo.world_size`` or backend, or traces of one host (one clock)
  whose time ranges never meet. tracekit refuses them with an error naming two of the files:
  matching collectives across unrelated runs gives numbers that look right and are not.
  Analyse each job's files separately.

Clocks: every file keeps its own ``host_name`` and ``baseTimeNanoseconds`` (TraceInfo), so
time comparisons are made only between traces of one host; traces of different hosts may be
skewed (tracekit/clock.py aligns them).

:func:`coverage_warnings` says, one line per missing thing across all files, what the traces
lack (distributedInfo, ProfilerStep markers, record_param_comms, host_name) and what was done
instead: tracekit never guesses silently. (When no trace has host_name, tracekit.ingest.topology's
"topology unknown" warning is that line.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from tracekit.errors import TracekitError

if TYPE_CHECKING:  # types only: analyses use ranges(), and must not import the readers
    from tracekit.ingest.kineto_info import TraceInfo
    from tracekit.ingest.run_record import RunRecord

T = TypeVar("T")


def file_facts(info: TraceInfo, frame: pl.DataFrame) -> dict[str, Any]:
    """What :func:`select_traces` asks of one file: its events' time range (ns), its host and
    the process id most of its CPU events carry (per file: computed where the file is read)."""
    lo, hi = (frame["start_ns"].min(), frame["end_ns"].max()) if frame.height else (None, None)
    return {
        "start": lo,
        "end": hi,
        "host": info.host_name,
        "clock": (info.host_name, info.base_ns is not None),
        "pid": _pid(frame),
    }


def _pid(frame: pl.DataFrame) -> str | None:
    """The process id most CPU events carry (asked only of ranks several files claim: a
    string scan over every event)."""
    cpu = frame.filter((pl.col("device") == "cpu") & pl.col("pid").str.contains(r"^\d+$"))
    return cpu["pid"].mode().sort()[0] if cpu.height else None


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if None in (a["start"], a["end"], b["start"], b["end"]):
        return False
    return a["start"] < b["end"] and b["start"] < a["end"]


def names(paths: Sequence[Any], most: int = 3) -> str:
    """'a, b and 3 more': file names for a one-line message."""
    shown = [getattr(p, "name", str(p)) for p in paths[:most]]
    rest = len(paths) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


def ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out: list[str] = []
    vals = sorted(set(values))
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)


def missing_ranges(present: set[int], world: int) -> list[tuple[int, int]]:
    """The runs [a, b] of ranks 0..world-1 not in ``present``, from the gaps between present
    ranks: as long as the ranks that have traces, never as long as the declared world."""
    out, prev = [], -1
    for r in sorted(r for r in present if 0 <= r < world):
        if r > prev + 1:
            out.append((prev + 1, r - 1))
        prev = r
    if prev < world - 1:
        out.append((prev + 1, world - 1))
    return out


def _range_text(runs: Sequence[tuple[int, int]], most: int = 12) -> str:
    """[(2, 127), (130, 130)] -> '2-127, 130'; past ``most`` runs, the count of the rest."""
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f" and {len(runs) - most} more runs" if len(runs) > most else "")


def _gap_s(a: dict[str, Any], b: dict[str, Any]) -> float:
    first, second = sorted((a, b), key=lambda f: f["start"])
    return (second["start"] - first["end"]) / 1e9


def _one_rank(rank: int, items: list[tuple[TraceInfo, T, dict]]) -> tuple[TraceInfo, T, dict]:
    """The trace to use for a rank several files claim: the latest profiling cycle, or an error."""
    items = sorted(items, key=lambda t: (t[2]["start"] is None, t[2]["start"] or 0))
    for i, (a_info, _, a) in enumerate(items):
        for b_info, _, b in items[i + 1 :]:
            if _overlap(a, b):
                raise TracekitError(
                    f"rank {rank} is claimed by {a_info.path} and {b_info.path} at the same time "
                    "(their time ranges overlap): keep one of them",
                    b_info.path,
                )
    processes = {(f["host"], f["pid"]) for _, _, f in items}
    if len(processes) > 1:
        (a_info, _, a), (b_info, _, b) = items[0], items[-1]
        raise TracekitError(
            f"rank {rank} has traces from different processes ({a_info.path.name}: pid {a['pid']}"
            f"{' on ' + a['host'] if a['host'] else ''}; {b_info.path.name}: pid {b['pid']}"
            f"{' on ' + b['host'] if b['host'] else ''}): several jobs' traces in one folder; "
            "analyse each job's traces separately",
            b_info.path,
        )
    info, frame, facts = items[-1]
    ignored = [i.path for i, _, _ in items[:-1]]
    note = (
        f"{len(items)} traces of rank {rank} from one process (profiling cycles): using the "
        f"latest, {info.path.name}; ignored: {names(ignored, most=10)}"
    )
    return dataclasses.replace(info, warnings=(*info.warnings, note)), frame, facts


def select_traces(
    parsed: Sequence[tuple[TraceInfo, T]], facts: Sequence[dict[str, Any]]
) -> list[tuple[TraceInfo, T]]:
    """One trace per rank from one job, or TracekitError (see the module docstring); FACTS:
    :func:`file_facts` of each parsed file, in the same order."""
    by_rank: dict[int, list[tuple[TraceInfo, T, dict]]] = {}
    for (info, frame), fact in zip(parsed, facts):
        by_rank.setdefault(info.rank, []).append((info, frame, dict(fact)))
    chosen = [
        items[0] if len(items) == 1 else _one_rank(rank, items) for rank, items in by_rank.items()
    ]
    _check_one_job(chosen)
    return [(info, frame) for info, frame, _ in chosen]


def _check_one_job(chosen: Sequence[tuple[TraceInfo, Any, dict]]) -> None:
    for field, what in (("world_size", "world size"), ("backend", "backend")):
        seen: dict[Any, TraceInfo] = {}
        for info, _, _ in chosen:
            value = getattr(info, field)
            if value is not None:
                seen.setdefault(value, info)
        if len(seen) > 1:
            (va, a), (vb, b) = list(seen.items())[:2]
            raise TracekitError(
                f"traces from different jobs: {a.path.name} says {what} {va}, {b.path.name} "
                f"says {vb}; analyse each job's traces separately",
                b.path,
            )
    by_clock: dict[Any, list[tuple[TraceInfo, dict]]] = {}
    for info, _, facts in chosen:
        if facts["host"] and facts["start"] is not None:
            by_clock.setdefault(facts["clock"], []).append((info, facts))
    for members in by_clock.values():
        members.sort(key=lambda m: m[1]["start"])
        # sweep: a gap between everything so far and the next trace splits the host's traces
        end_so_far, first = members[0][1]["end"], members[0]
        for info, facts in members[1:]:
            if facts["start"] >= end_so_far:
                raise TracekitError(
                    f"{first[0].path.name} and {info.path.name} come from one host "
                    f"({facts['host']}) but do not overlap in time ({_gap_s(first[1], facts):.1f} s "
                    "apart): not one job (or different profiling cycles of different ranks); "
                    "analyse each job's traces separately",
                    info.path,
                )
            end_so_far = max(end_so_far, facts["end"])


# --- what the traces do not say --------------------------------------------------------------


def _files_line(what: str, infos: list[TraceInfo], total: int, consequence: str) -> str:
    where = (
        f"all {total} traces"
        if len(infos) == total and total > 1
        else names([i.path for i in infos])
    )
    return f"no {what} in {where}: {consequence}"


def coverage_flags(events: pl.DataFrame) -> pl.DataFrame:
    """Per rank, what :func:`coverage_warnings` asks of its events: rank, comm (any
    communication event), rpc (record_param_comms rows), c10d (c10d:: calls that say their op),
    gpu (any GPU event). One rank's flags do not depend on another's (a per-rank map)."""
    # lazy: an eager group_by copies every column of the frame (+140 MB at 1M events)
    return (
        events.lazy()
        .group_by("rank")
        .agg(
            (pl.col("kind") == "communication").any().alias("comm"),
            (pl.col("name") == "record_param_comms").any().alias("rpc"),
            (pl.col("name").str.starts_with("c10d::") & pl.col("op").is_not_null())
            .any()
            .alias("c10d"),
            (pl.col("device") == "gpu").any().alias("gpu"),
        )
        .collect()
    )


def coverage_warnings(
    infos: Sequence[TraceInfo], flags: pl.DataFrame, run: RunRecord | None
) -> list[str]:
    """One line per thing the traces lack, naming the files, and what tracekit does instead
    (FLAGS: :func:`coverage_flags` of every rank)."""
    infos = list(infos)
    total, out = len(infos), []
    no_dist = [i for i in infos if i.rank_source != "distributedInfo" and i.world_size is None]
    if no_dist:
        out.append(
            _files_line(
                "distributedInfo",
                no_dist,
                total,
                "rank from the file name (else 0), world size and process groups unknown",
            )
        )
    no_steps = [i for i in infos if i.profiler_steps == 0]
    if no_steps:
        out.append(
            _files_line(
                "ProfilerStep markers",
                no_steps,
                total,
                "the window is the whole trace; no step times",
            )
        )
    per_rank = flags
    # CPU/gloo traces of torch 2.x never carry record_param_comms: their c10d:: calls say the op
    lacking = set(
        per_rank.filter(pl.col("comm") & ~pl.col("rpc") & (pl.col("gpu") | ~pl.col("c10d")))[
            "rank"
        ].to_list()
    )
    no_rpc = [i for i in infos if i.rank in lacking]
    if no_rpc:
        out.append(
            _files_line(
                "record_param_comms",
                no_rpc,
                total,
                "collectives' process groups unknown; sizes only where nccl:*/gloo:*/"
                "c10d:: rows carry them",
            )
        )
    # host_name matters only to place several ranks on nodes; when no trace has it, the
    # topology warning (tracekit.ingest.topology) is that one line
    no_host = [i for i in infos if not i.host_name]
    if total > 1 and 0 < len(no_host) < total and not (run and run.nodes):
        out.append(
            _files_line(
                "host_name",
                no_host,
                total,
                "these ranks cannot be placed on nodes by host; give --ranks-per-node",
            )
        )
    return out


def missing_ranks_warning(infos: Sequence[TraceInfo], run: RunRecord | None) -> str | None:
    """'ranks 2-127 of world size 128 have no trace', from run.json or distributedInfo."""
    source, world = "run.json", run.world_size if run is not None else None
    if world is None:
        sizes = {i.world_size for i in infos if i.world_size}
        world, source = (sizes.pop(), "distributedInfo") if len(sizes) == 1 else (None, "")
    if not world:
        return None
    gaps = missing_ranges({i.rank for i in infos}, world)
    if not gaps:
        return None
    count = sum(b - a + 1 for a, b in gaps)
    word = "rank" if count == 1 else "ranks"
    verb = "has" if count == 1 else "have"
    return (
        f"{word} {_range_text(gaps)} of world size {world} ({source}) {verb} no trace: "
        f"the analysis covers rank{'s' if len(infos) > 1 else ''} "
        f"{ranges([i.rank for i in infos])} only"
    )
