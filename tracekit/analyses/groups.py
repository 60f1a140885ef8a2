"""Which process group each collective call belongs to, and its sequence number in that group.

GPU/NCCL traces name the group on every collective (``record_param_comms``: Process Group Name,
Description, Ranks). CPU/gloo traces do not: a ``c10d::<op>`` call says neither its group nor
its sequence number. The flight recorder (on for gloo too) does: every entry has the group
(``process_group`` = [name, desc]), its ``collective_seq_id`` in that group, and
``time_created_ns``, taken *inside* the c10d call on the same epoch clock as the trace
(``baseTimeNanoseconds + ts*1000``). So, per rank:

    rule: walk the rank's c10d calls (sorted by start) and its flight-recorder entries (sorted by
    time_created_ns) together; a call takes the first unused, later entry of a compatible op
    whose time_created_ns lies within its call span widened by TOLERANCE_NS, unless that entry
    lies nearer to the next call's span (then it is the next call's). Compatible ops: the
    same, plus reduce_scatter <-> all_reduce (gloo records a reduce-scatter as an all_reduce).

Failure modes, and what happens then:
- entries older than the ring buffer (2000 by default) are gone: those calls get no group
  (``group_source`` "unmatched", a warning) and are reported by duration only;
- a dump from another run, or a clock step between trace and dump: nothing matches; the rank
  falls back as if it had no dump;
- gloo's list-form ``reduce_scatter`` records one all_reduce entry *per rank*: the call takes
  the first, the rest are skipped (every rank does the same, so sequence numbers still agree);
- calls issued concurrently from several threads can overlap; order plus the op check resolve
  most cases, equal-op overlapping calls may swap (same group and op, so only seq differs);
- send/recv leave no entry on gloo: p2p rows get no group, they are matched by (src, dst, k).

Without dumps: a rank whose trace pg_config lists a single group takes it (exact), in per-group
order; one whose pg_config lists several groups gets no group (its collectives are reported by
duration only, with a warning: any guess would silently match calls of different groups); a
trace without pg_config (older torch) has all its calls put in one "default" group of every
traced rank, in per-rank order, with a warning (matching then checks op and size).

Group members, best first: run.json ``config.strategy_options.process_groups`` ({name, dim,
ranks[, desc]}, name = the c10d group name, or its description); the trace's
``distributedInfo.pg_config`` (groups this rank belonged to when profiling started); the
flight-recorder dumps (ranks whose dumps hold the group); record_param_comms "Process Group
Ranks" (GPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from tracekit import guarded_read

if TYPE_CHECKING:
    from tracekit.events import DType
    from tracekit.ingest.flight_recorder import FlightRecord
    from tracekit.ingest.job import Job

TOLERANCE_NS = 500_000
P2P = ("send", "recv")
DEFAULT_GROUP = "default"
# what attribute_calls adds to each c10d call (and the collectives table carries to attribute)
FR_COLUMNS = {
    "fr_group": pl.Utf8,
    "fr_desc": pl.Utf8,
    "fr_seq": pl.Int64,
    "fr_in_bytes": pl.Int64,
    "fr_out_bytes": pl.Int64,
    "fr_source": pl.Utf8,
}
GROUP_COLUMNS: dict[str, DType] = {
    "group": pl.Utf8,
    "group_desc": pl.Utf8,
    "group_ranks": pl.List(pl.Int64),
    "group_seq": pl.Int64,
    "group_source": pl.Utf8,
    "dim": pl.Utf8,
}
# flight-recorder op -> the c10d ops it can stand for
_COMPATIBLE = {"all_reduce": {"all_reduce", "reduce_scatter"}, "reduce_scatter": {"reduce_scatter"}}
_NO_DESC = {"", "undefined", None}


@dataclass(frozen=True)
class GroupSources:
    """What names and populates process groups: dumps, run.json groups, the traces' pg_config."""

    records: tuple[FlightRecord, ...] = ()
    run_groups: tuple[dict[str, Any], ...] = ()
    pg_configs: dict[int, tuple[dict, ...]] = field(default_factory=dict)
    world_size: int | None = None

    @classmethod
    def of(cls, job: Job) -> GroupSources:
        """From what the Job loaded: every flight-recorder dump of the folder, run.json
        ``strategy_options.process_groups``, each trace's pg_config."""
        run = job.run
        pg = {int(i.rank): tuple(i.pg_config or ()) for i in job.infos}
        world = (run.world_size if run is not None else None) or max(
            (i.world_size or 0 for i in job.infos), default=0
        )
        groups = run.config.process_groups if run is not None else ()
        return cls(job.flight_records, groups, pg, world or None)


# --- group membership -------------------------------------------------------------------------


def _members(sources: GroupSources) -> dict[str, list[int]]:
    """c10d group name -> ranks, from the flight-recorder dumps (pg_config ranks, else who holds it)."""
    out: dict[str, set[int]] = {}
    for rec in sources.records:
        for name in rec.entries["pg_name"].drop_nulls().unique().to_list():
            out.setdefault(name, set()).add(int(cast(int, rec.rank)))
        for row in rec.groups.iter_rows(named=True):
            if row["pg_name"] and row["ranks"] and row["ranks_source"] == "pg_config":
                out.setdefault(row["pg_name"], set()).update(int(r) for r in row["ranks"])
    return {k: sorted(v) for k, v in out.items()}


class _Resolver:
    """(rank, group name, desc) -> (ranks, dim) from the best source that knows it."""

    def __init__(self, sources: GroupSources) -> None:
        self.s = sources
        self.fr = _members(sources)

    def __call__(
        self, rank: int, name: str | None, desc: str | None, hint: list[int] | None = None
    ) -> tuple[list[int] | None, str | None]:
        mine = [g for g in self.s.run_groups if rank in g["ranks"]]
        # the c10d name first; then the description, which a strategy may record as name or desc
        tries = [("name", name)] + (
            [("desc", desc), ("name", desc)] if desc not in _NO_DESC else []
        )
        for key, value in tries:
            for g in mine:
                if value is not None and str(g.get(key)) == str(value):
                    return sorted(int(r) for r in g["ranks"]), g.get("dim")
        ranks = None
        for cfg in self.s.pg_configs.get(rank, ()):
            if (
                name is not None
                and str(cfg.get("pg_name")) == str(name)
                and isinstance(cfg.get("ranks"), list)
            ):
                ranks = sorted(int(r) for r in cfg["ranks"])
        ranks = ranks or hint or self.fr.get(name or "")
        dim = next((g.get("dim") for g in mine if ranks and sorted(g["ranks"]) == ranks), None)
        return ranks, dim


# --- flight-recorder matching -------------------------------------------------------------------


def _compatible(entry_op: str | None, call_op: str | None) -> bool:
    return entry_op is not None and call_op in _COMPATIBLE.get(entry_op, {entry_op})


def _gap(t: int, start: int, end: int) -> int:
    """Distance from t to the interval [start, end] (0 inside)."""
    return max(start - t, 0, t - end)


def match_entries(
    calls: list[dict[str, Any]], entries: list[dict[str, Any]], tolerance_ns: int = TOLERANCE_NS
) -> list[int | None]:
    """For each call (sorted by call_start_ns), the index of its entry (sorted by time) or None.

    The rule is the module docstring's; both lists must be in time order.
    """
    out: list[int | None] = []
    j = 0
    for i, c in enumerate(calls):
        start, end = c.get("call_start_ns"), c.get("call_end_ns")
        if start is None or end is None:
            out.append(None)
            continue
        while j < len(entries) and entries[j]["time_created_ns"] < start - tolerance_ns:
            j += 1
        nxt = calls[i + 1] if i + 1 < len(calls) else None
        found = None
        k = j
        while k < len(entries) and entries[k]["time_created_ns"] <= end + tolerance_ns:
            e = entries[k]
            if _compatible(e["op"], c["op"]):
                t = e["time_created_ns"]
                near_next = (
                    nxt is not None
                    and nxt.get("call_start_ns") is not None
                    and _compatible(e["op"], nxt["op"])
                    and _gap(t, nxt["call_start_ns"], nxt["call_end_ns"]) < _gap(t, start, end)
                )
                if not near_next:
                    found = k
                break
            k += 1
        out.append(found)
        if found is not None:
            j = found + 1
    return out


def _entries_of(rec: FlightRecord) -> list[dict[str, Any]]:
    e = rec.entries.filter(
        ~pl.col("is_p2p").fill_null(False)
        & pl.col("op").is_not_null()
        & pl.col("time_created_ns").is_not_null()
    )
    return (
        e.sort("time_created_ns")
        .select(
            "pg_name",
            "pg_desc",
            "collective_seq_id",
            "op",
            "in_bytes",
            "out_bytes",
            "time_created_ns",
        )
        .to_dicts()
    )


def attribute_calls(
    calls: pl.DataFrame, sources: GroupSources | None = None
) -> tuple[pl.DataFrame, list[str]]:
    """Add FR_COLUMNS to the ``c10d::`` call rows (rank, op, start_ns, end_ns) of CPU ranks: each
    call's flight-recorder entry by the module docstring's rule. fr_source is "flight_recorder",
    "unmatched" (the rank has a dump that holds no entry for the call) or null (no dump)."""
    sources = sources or GroupSources()
    records = {int(cast(int, r.rank)): r for r in sources.records}
    calls = calls.sort("rank", "start_ns")
    n = calls.height
    cols: dict[str, list] = {c: [None] * n for c in FR_COLUMNS}
    warnings: list[str] = []
    unmatched: dict[int, int] = {}
    rows = calls.select("rank", "op", "start_ns", "end_ns").to_dicts()
    by_rank: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r["op"] not in P2P:
            by_rank.setdefault(int(r["rank"]), []).append(i)
    for rank, idx in by_rank.items():
        rec = records.get(rank)
        if rec is None:
            continue
        entries = _entries_of(rec)
        mine = [
            {
                "op": rows[i]["op"],
                "call_start_ns": rows[i]["start_ns"],
                "call_end_ns": rows[i]["end_ns"],
            }
            for i in idx
        ]
        picks = match_entries(mine, entries)
        if not any(k is not None for k in picks):
            continue  # a dump of another run or clock: as if none
        for i, k in zip(idx, picks):
            if k is None:
                cols["fr_source"][i] = "unmatched"
                unmatched[rank] = unmatched.get(rank, 0) + 1
                continue
            e = entries[k]
            cols["fr_group"][i], cols["fr_desc"][i], cols["fr_seq"][i] = (
                e["pg_name"],
                e["pg_desc"],
                e["collective_seq_id"],
            )
            cols["fr_in_bytes"][i], cols["fr_out_bytes"][i] = e["in_bytes"], e["out_bytes"]
            cols["fr_source"][i] = "flight_recorder"
    if unmatched:
        warnings.append(
            "flight recorder: "
            + ", ".join(f"{v} calls on rank {r}" for r, v in sorted(unmatched.items()))
            + " matched no entry (ring buffer wrapped?): no group, duration only"
        )
    drop = [c for c in FR_COLUMNS if c in calls.columns]
    return calls.drop(drop).hstack(pl.DataFrame(cols, schema=FR_COLUMNS)), warnings


# --- attribution --------------------------------------------------------------------------------


def _seq_in_order(table: pl.DataFrame) -> pl.Series:
    """Per (rank, group) call order from 1, for rows whose group is known but seq is not."""
    order = pl.when(pl.col("group").is_not_null()).then(
        pl.int_range(1, pl.len() + 1).over("rank", "group", order_by="start_ns")
    )
    return table.select(order.cast(pl.Int64))[:, 0]


def _parse_ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # a string from the trace's args, not a file
        return None
    ranks = guarded_read.rank_list(value)  # not ints, negative or past 2^31: no hint
    return sorted(ranks) if ranks else None


def attribute(
    table: pl.DataFrame, sources: GroupSources | None = None
) -> tuple[pl.DataFrame, list[str]]:
    """Fill group, group_desc, group_ranks, group_seq, group_source, dim (and group_size, and
    bytes the trace could not size) on a collectives table whose CPU rows carry FR_COLUMNS
    (attribute_calls); see the module docstring."""
    sources = sources or GroupSources()
    warnings: list[str] = []
    for c, t in FR_COLUMNS.items():
        if c not in table.columns:
            table = table.with_columns(pl.lit(None, dtype=t).alias(c))
    if table.height == 0:
        return table.with_columns(
            *[pl.lit(None, dtype=t).alias(c) for c, t in GROUP_COLUMNS.items()]
        ).drop(list(FR_COLUMNS)), warnings
    resolve = _Resolver(sources)
    traced = sorted(table["rank"].unique().to_list())
    rows = table.to_dicts()
    by_rank: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_rank.setdefault(r["rank"], []).append(i)
    out: list[dict[str, Any]] = [{} for _ in rows]
    fallback_ranks: list[int] = []
    several_ranks: list[int] = []
    for rank in traced:
        fallback: list[int] = []
        for i in by_rank[rank]:
            r = rows[i]
            if r["op"] in P2P:
                out[i] = {"group_source": "p2p"}
            elif r["device"] != "cpu":
                out[i] = {
                    "group": r["group"],
                    "group_source": "trace" if r["group"] is not None else None,
                    "hint": _parse_ranks(r.get("group_ranks_text")),
                }
            elif r["fr_source"] == "flight_recorder":
                fr_bytes = r["fr_out_bytes"] if r["op"] == "all_gather" else r["fr_in_bytes"]
                out[i] = {
                    "group": r["fr_group"],
                    "group_desc": r["fr_desc"],
                    "group_seq": r["fr_seq"],
                    "group_source": "flight_recorder",
                    "fr_bytes": fr_bytes,
                }
            elif r["fr_source"] == "unmatched":
                out[i] = {"group_source": "unmatched"}
            else:
                fallback.append(i)
        if not fallback:
            continue
        configs = [c for c in sources.pg_configs.get(rank, ()) if c.get("pg_name") is not None]
        if len(configs) == 1:
            cfg = configs[0]
            one = {
                "group": str(cfg["pg_name"]),
                "group_desc": cfg.get("pg_desc"),
                "group_source": "pg_config",
            }
        elif configs:
            several_ranks.append(rank)
            one = {"group_source": "unknown"}
        else:
            fallback_ranks.append(rank)
            one = {
                "group": DEFAULT_GROUP,
                "group_desc": None,
                "group_source": "default",
                "hint": traced,
            }
        for i in fallback:
            out[i] = dict(one)
    if several_ranks:
        warnings.append(
            f"ranks {several_ranks}: several process groups (trace pg_config) but no flight-recorder dump "
            "(<run>/nccl/fr_rank<R>.json): gloo traces do not name a call's group, so their collectives are not "
            "matched across ranks (durations only, no group); keep the dumps to get groups and transfer/wait"
        )
    if fallback_ranks:
        warnings.append(
            f"ranks {fallback_ranks}: no flight-recorder dump and no process groups in the trace: every gloo "
            "collective taken as one default group of all traced ranks, matched across ranks by order (op and "
            "size checked)"
        )

    # members and dims, once per (rank, group)
    resolved: dict[tuple, tuple] = {}
    cols: dict[str, list] = {c: [] for c in (*GROUP_COLUMNS, "fr_bytes")}
    for r, a in zip(rows, out):
        group = a.get("group")
        ranks, dim = None, None
        if group is not None:
            key = (r["rank"], group, a.get("group_desc"))
            if key not in resolved:
                resolved[key] = resolve(r["rank"], group, a.get("group_desc"), a.get("hint"))
            ranks, dim = resolved[key]
        for c, v in (
            ("group", group),
            ("group_desc", a.get("group_desc")),
            ("group_ranks", ranks),
            ("group_seq", a.get("group_seq")),
            ("group_source", a.get("group_source")),
            ("dim", dim),
            ("fr_bytes", a.get("fr_bytes")),
        ):
            cols[c].append(v)
    filled = pl.DataFrame(cols, schema={**GROUP_COLUMNS, "fr_bytes": pl.Int64})
    table = table.drop([c for c in (*GROUP_COLUMNS, *FR_COLUMNS) if c in table.columns]).hstack(
        filled
    )
    table = table.with_columns(
        pl.coalesce(pl.col("group_seq"), _seq_in_order(table)).alias("group_seq"),
        pl.coalesce(pl.col("group_ranks").list.len().cast(pl.Int32), pl.col("group_size")).alias(
            "group_size"
        ),
        pl.coalesce(pl.col("bytes"), pl.col("fr_bytes")).alias("bytes"),
    ).drop("fr_bytes")
    return table, warnings


def drop_resolved_warnings(warnings: list[str], table: pl.DataFrame) -> list[str]:
    """Ingest warns that it left all-gather/reduce-scatter bytes null when a trace lists groups of
    several sizes; drop that warning when the flight recorder sized every such call."""
    sized = (
        table.filter(pl.col("op").is_in(["all_gather", "reduce_scatter"]))["bytes"].null_count()
        == 0
    )
    return [w for w in warnings if not (sized and "bytes left null for" in w)]
