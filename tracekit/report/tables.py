"""The tables of a report (also the Dash pages' and the CLI's): text cells, unescaped.

A :data:`Table` is (title, header, rows of text cells); each output escapes the cells its own
way (HTML, Markdown, Dash). Unknown (null) values are shown as ``–``, never 0.
Which sections a report shows, in which order, with which figures and table: the records of
tracekit.analyses.manifest (``REPORT``); :func:`table_of` finds a record's table here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import polars as pl

from tracekit.analyses import manifest
from tracekit.figures.compare import Run, compare_rows
from tracekit.figures.pipeline import pipeline_theory_text
from tracekit.figures.style import UNKNOWN, fmt_bytes, fmt_frac, fmt_s
from tracekit.summary import Summary
from tracekit.summary.collectives import CollectiveGroup, CollectiveOp
from tracekit.summary.traffic import TrafficGroup, TrafficOp

TOP_EVENTS = 15
MAX_TABLE_ROWS = 200

Table = tuple[str, list[str], list[list[str]]]  # title, header, rows of text cells


def _f(x: Any, digits: int = 6) -> str:
    if x is None:
        return UNKNOWN
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _gbps(x: Any) -> str:
    return _f(x, 3)


def _cells(values: Iterable[Any], fmt: Callable[[Any], str] = _f) -> list[str]:
    """``fmt`` of each value."""
    return [fmt(v) for v in values]


def _short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _pct(part: Any, whole: Any) -> str:
    try:
        return f"{100 * float(part) / float(whole):.0f}%" if whole else UNKNOWN
    except (TypeError, ValueError):
        return UNKNOWN


def rank_table(summary: Summary) -> Table:
    """Each rank's window as compute, transfer, waiting on peers, other and idle (#28: waiting
    for a peer moves no bytes, so it is its own state; summary.json why.wait_states). Without a
    why section (no cross-rank calls matched) transfer is the whole communication time and
    waiting is unknown ("–")."""
    head = [
        "rank",
        "node",
        "span s",
        "step s",
        "compute s",
        "transfer s",
        "overlap s",
        "exposed transfer s",
        "waiting on peers s",
        "other s",
        "idle s",
        "idle %",
    ]
    waits = {w.rank: w for w in (summary.why.wait_states.per_rank if summary.why else [])}
    rows = []
    for r in summary.ranks:
        w = waits.get(r.rank)
        transfer = r.comm_s if w is None else w.comm_transfer_s
        exposed = r.exposed_comm_s if w is None else w.transfer_s
        cells = (r.rank, r.node, r.span_s, r.step_time_s, r.compute_s, transfer, r.overlap_s)
        rest = (exposed, None if w is None else w.waiting_s, r.other_s, r.idle_s)
        rows.append(_cells(cells + rest) + [_pct(r.idle_s, r.span_s)])
    return "per-rank breakdown", head, rows


def top_events(totals: pl.DataFrame | None, n: int = TOP_EVENTS) -> Table:
    """The events with the most total time (names exactly as in the trace), from their totals
    (tracekit.analyses.event_totals: count and total_ns per name, kind and device)."""
    head = ["name", "kind", "device", "count", "total s", "mean µs"]
    if totals is None or totals.height == 0:
        return "top events by total time", head, []
    t = (
        totals.with_columns((pl.col("total_ns") * 1e-9).alias("total_s"))
        .sort("total_s", "name", descending=[True, False])
        .head(n)
    )
    rows = [
        [
            _short(str(r["name"])),
            str(r["kind"]),
            str(r["device"]),
            str(r["count"]),
            f"{r['total_s']:.6f}",
            f"{1e6 * r['total_s'] / max(1, r['count']):.1f}",
        ]
        for r in t.iter_rows(named=True)
    ]
    return "top events by total time", head, rows


def _timing_cells(r: CollectiveOp | CollectiveGroup) -> list[str]:
    """transfer, wait, time (s); algbw, busbw (GB/s)."""
    return _cells((r.transfer_s, r.wait_s, r.time_s)) + _cells((r.algbw_gbps, r.busbw_gbps), _gbps)


def collectives_table(summary: Summary) -> Table:
    co = summary.collectives
    # payload: S summed over every rank's rows (rank_bytes) and over calls (call_bytes)
    head = [
        "op",
        "rank rows",
        "payload Σ ranks",
        "payload Σ calls",
        "transfer s",
        "wait s",
        "time s",
        "algbw GB/s",
        "busbw GB/s",
    ]
    rows = [
        [r.op or "unknown", _f(r.count)]
        + _cells((r.bytes, r.call_bytes), fmt_bytes)
        + _timing_cells(r)
        for r in co.per_op
    ]
    rows += [
        # per_group bytes count per call
        [f"{g.label} · {g.op}", _f(g.rank_rows)]
        + _cells((g.rank_bytes, g.bytes), fmt_bytes)
        + _timing_cells(g)
        for g in co.per_group[:MAX_TABLE_ROWS]
    ]
    return (
        (
            f"collectives: {co.count} calls, ideal bytes per rank "
            f"{fmt_bytes(co.ideal_bytes_per_rank)}"
        ),
        head,
        rows,
    )


def pipeline_table(summary: Summary) -> Table | None:
    p = summary.pipeline
    if not p:
        return None
    head = [
        "stage",
        "fill s",
        "steady s",
        "drain s",
        "max in-flight",
        "activation peak",
        "weight versions",
    ]
    rows = [
        _cells((r.stage, r.fill_s, r.steady_s, r.drain_s, r.max_inflight_microbatches))
        + [fmt_bytes(r.activation_peak_bytes), _f(r.weight_versions)]
        for r in p.per_stage
    ]
    return pipeline_theory_text(p), head, rows


def overlap_table(summary: Summary) -> Table | None:
    ov = summary.overlap
    if not ov:
        return None
    head = ["unit", "phase", "op", "duration s", "hidden s", "exposed s"]
    rows = [
        _cells((r.unit, r.phase, r.op), str) + _cells((r.duration_s, r.hidden_s, r.exposed_s))
        for r in ov.per_layer[:MAX_TABLE_ROWS]
    ]
    title = (
        f"all-gather {_f(ov.allgather_s)} s, {fmt_frac(ov.allgather_hidden_fraction)} hidden; "
        f"reduce-scatter {_f(ov.reducescatter_s)} s, "
        f"{fmt_frac(ov.reducescatter_hidden_fraction)} hidden"
    )
    return title, head, rows


def memory_table(summary: Summary) -> Table | None:
    mem = summary.memory
    if not mem or not mem.per_rank:
        return None
    head = ["rank", "params", "grads", "optimizer", "model states", "activation peak", "peak"]
    rows = [
        [_f(r.rank)]
        + _cells(
            (
                r.params_bytes,
                r.grads_bytes,
                r.optimizer_bytes,
                r.model_states_bytes,
                r.activation_peak_bytes,
                r.peak_bytes,
            ),
            fmt_bytes,
        )
        for r in mem.per_rank
    ]
    theory = mem.theory
    title = "memory per rank" + (
        f"; theory {theory.formula} = {fmt_bytes(theory.model_states_bytes)}" if theory else ""
    )
    return title, head, rows


def _wire_cells(r: TrafficOp | TrafficGroup) -> list[str]:
    """intra-node, inter-node and all wire bytes; payload summed over calls."""
    return _cells((r.intra, r.inter, r.bytes, r.payload_bytes), fmt_bytes)


def traffic_table(summary: Summary) -> Table | None:
    tr = summary.traffic
    if not tr:
        return None
    # wire bytes: on every link, summed over links and calls of the window (docs/traffic.md)
    head = ["op", "intra-node wire", "inter-node wire", "wire bytes", "payload Σ calls"]
    rows = [[r.op] + _wire_cells(r) for r in tr.by_op]
    rows += [[f"{g.label} · {g.op}"] + _wire_cells(g) for g in tr.by_group[:MAX_TABLE_ROWS]]
    return (
        (
            f"traffic: {fmt_frac(tr.inter_node_fraction)} of "
            f"{fmt_bytes(tr.total_bytes)} wire bytes (all links, whole window) "
            "on inter-node links"
        ),
        head,
        rows,
    )


_COMPARE_BYTES = ("model_states_bytes", "collective_bytes", "wire_bytes", "inter_node_bytes")


def compare_table(runs: Sequence[Run]) -> Table:
    """One row per run (tracekit.figures.compare_rows), the comparison report's first table."""
    head = [
        "run",
        "strategy",
        "ranks",
        "step s",
        "vs fastest",
        "step spread",
        "waited for a CPU",
        "compute %",
        "exposed transfer %",
        "waiting on peers %",
        "idle %",
        "model states",
        "payload bytes (Σ ranks)",
        "wire bytes (all links)",
        "inter-node wire bytes",
        "bubble",
        "all-gather hidden",
    ]
    rows = [
        [
            r["run"],
            str(r["strategy"] or "-"),
            str(r["ranks"]),
            _f(r["step_time_s"]),
            r["vs_fastest"] or UNKNOWN,
            fmt_frac(r["step_spread"]),
            fmt_frac(r["cpu_wait_share_max"]),
            _pct(r["compute_total_s"], r["span_s"]),
            # without wait states, the whole exposed comm (waiting unknown: "–")
            _pct(
                r["exposed_transfer_s"] if r["waiting_s"] is not None else r["exposed_comm_s"],
                r["span_s"],
            ),
            _pct(r["waiting_s"], r["span_s"]) if r["waiting_s"] is not None else UNKNOWN,
            _pct(r["idle_s"], r["span_s"]),
            *(fmt_bytes(r[k]) for k in _COMPARE_BYTES),
            fmt_frac(r["bubble_fraction"]),
            fmt_frac(r["allgather_hidden_fraction"]),
        ]
        for r in compare_rows(runs)
    ]
    return "comparison", head, rows


def table_of(section: manifest.Section) -> Callable[[Summary], Table | None] | None:
    """The table builder a section's record names (tracekit.analyses.manifest), or None."""
    if section.table is None:
        return None
    build: Callable[[Summary], Table | None] = globals()[section.table]
    return build


def why_table(summary: Summary) -> Table | None:
    """The root causes (summary.json ``why``): who and what the waits are charged to."""
    why = summary.why
    if why is None or not why.root_causes.top:
        return None
    rc = why.root_causes
    rows = [
        [f"rank {c.rank}", c.what[:80], c.label or UNKNOWN, c.kind, fmt_s(c.cost_s)] for c in rc.top
    ]
    return (
        f"root causes of {fmt_s(rc.wait_s)} of waits (direct {fmt_s(rc.direct_s)}, "
        f"propagated {fmt_s(rc.propagated_s)})",
        ["rank", "cause", "phase", "kind", "waits charged"],
        rows,
    )


def contention_table(summary: Summary) -> Table | None:
    """CPU contention per rank (summary.json ``contention``): waiting for a CPU, against wall."""
    c = summary.contention
    if c is None:
        return None
    rows = [
        [
            f"rank {r.rank}",
            fmt_s(r.cpu_wait_s),
            fmt_frac(r.cpu_wait_share),
            fmt_frac(r.cpu_wait_outside_share),
            fmt_frac(r.step_share_max),
            UNKNOWN if r.cpu_per_wall is None else f"{r.cpu_per_wall:.2f}",
            UNKNOWN if r.involuntary_switches is None else str(r.involuntary_switches),
            UNKNOWN if r.pinned is None else ("yes" if r.pinned else "no"),
            UNKNOWN if r.corun_slowdown is None else f"{r.corun_slowdown:.2f}x",
        ]
        for r in c.per_rank
    ]
    steps = summary.steps
    noise = (
        f"; step time {fmt_s(steps.median_s)} median, {fmt_s(steps.min_s)}–{fmt_s(steps.max_s)} "
        f"(spread {100 * steps.spread:.0f} %)"
        if steps is not None
        else ""
    )
    return (
        f"waiting for a CPU ({c.local_ranks or UNKNOWN} ranks on {c.machine_cores or UNKNOWN} "
        f"cores){noise}",
        [
            "rank",
            "waited for a CPU",
            "of its steps",
            "behind other processes",
            "worst step",
            "CPU/wall",
            "switches",
            "pinned",
            "co-run slowdown",
        ],
        rows,
    )
