"""The tables of a report (also the Dash pages' and the CLI's): text cells, unescaped.

A :data:`Table` is (title, header, rows of text cells); each output escapes the cells its own
way (HTML, Markdown, Dash). Unknown (null) values are shown as ``–``, never 0.
:data:`SECTIONS` is the order of one run's sections with their figures and table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import polars as pl

from tracekit.analyses.group_names import row_label
from tracekit.figures.compare import compare_rows
from tracekit.figures.lanes import EVENT_KINDS
from tracekit.figures.pipeline import pipeline_theory_text
from tracekit.figures.read import op_label, rank_rows, section, section_rows
from tracekit.figures.style import UNKNOWN, fmt_bytes, fmt_frac

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


def _cells(row: dict, keys: Iterable[str], fmt: Callable[[Any], str] = _f) -> list[str]:
    """``fmt`` of each of ``keys`` of ``row``."""
    return [fmt(row.get(k)) for k in keys]


def _short(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _pct(part: Any, whole: Any) -> str:
    try:
        return f"{100 * float(part) / float(whole):.0f}%" if whole else UNKNOWN
    except (TypeError, ValueError):
        return UNKNOWN


_RANK_KEYS = (
    "rank",
    "node",
    "span_s",
    "step_time_s",
    "compute_s",
    "comm_s",
    "overlap_s",
    "exposed_comm_s",
    "other_s",
    "idle_s",
)


def rank_table(summary: dict) -> Table:
    head = [
        "rank",
        "node",
        "span s",
        "step s",
        "compute s",
        "comm s",
        "overlap s",
        "exposed comm s",
        "other s",
        "idle s",
        "idle %",
    ]
    rows = [
        _cells(r, _RANK_KEYS) + [_pct(r.get("idle_s"), r.get("span_s"))] for r in rank_rows(summary)
    ]
    return "per-rank breakdown", head, rows


def top_events(events: pl.DataFrame | None, n: int = TOP_EVENTS) -> Table:
    """The events with the most total time (names exactly as in the trace)."""
    head = ["name", "kind", "device", "count", "total s", "mean µs"]
    if events is None or events.height == 0:
        return "top events by total time", head, []
    t = (
        events.filter(pl.col("kind").is_in(list(EVENT_KINDS)))
        .group_by("name", "kind", "device")
        .agg(
            pl.len().alias("count"),
            ((pl.col("end_ns") - pl.col("start_ns")).sum() * 1e-9).alias("total_s"),
        )
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


def _timing_cells(r: dict) -> list[str]:
    """transfer, wait, time (s); algbw, busbw (GB/s)."""
    return _cells(r, ("transfer_s", "wait_s", "time_s")) + _cells(
        r, ("algbw_gbps", "busbw_gbps"), _gbps
    )


def collectives_table(summary: dict) -> Table:
    co = section(summary, "collectives")
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
        [str(op_label(r)), _f(r.get("count"))]
        + _cells(r, ("bytes", "call_bytes"), fmt_bytes)
        + _timing_cells(r)
        for r in section_rows(summary, "collectives", "per_op")
    ]
    rows += [
        # per_group bytes count per call
        [f"{row_label(r)} · {r.get('op')}", _f(r.get("rank_rows"))]
        + _cells(r, ("rank_bytes", "bytes"), fmt_bytes)
        + _timing_cells(r)
        for r in section_rows(summary, "collectives", "per_group")[:MAX_TABLE_ROWS]
    ]
    return (
        (
            f"collectives: {co.get('count', 0)} calls, ideal bytes per rank "
            f"{fmt_bytes(co.get('ideal_bytes_per_rank'))}"
        ),
        head,
        rows,
    )


def pipeline_table(summary: dict) -> Table | None:
    p = section(summary, "pipeline")
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
        _cells(r, ("stage", "fill_s", "steady_s", "drain_s", "max_inflight_microbatches"))
        + [fmt_bytes(r.get("activation_peak_bytes")), _f(r.get("weight_versions"))]
        for r in section_rows(summary, "pipeline", "per_stage")
    ]
    return pipeline_theory_text(p), head, rows


def overlap_table(summary: dict) -> Table | None:
    ov = section(summary, "overlap")
    if not ov:
        return None
    head = ["unit", "phase", "op", "duration s", "hidden s", "exposed s"]
    rows = [
        _cells(r, ("unit", "phase", "op"), str) + _cells(r, ("duration_s", "hidden_s", "exposed_s"))
        for r in section_rows(summary, "overlap", "per_layer")[:MAX_TABLE_ROWS]
    ]
    title = (
        f"all-gather {_f(ov.get('allgather_s'))} s, {fmt_frac(ov.get('allgather_hidden_fraction'))} hidden; "
        f"reduce-scatter {_f(ov.get('reducescatter_s'))} s, "
        f"{fmt_frac(ov.get('reducescatter_hidden_fraction'))} hidden"
    )
    return title, head, rows


_MEMORY_KEYS = (
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "model_states_bytes",
    "activation_peak_bytes",
    "peak_bytes",
)


def memory_table(summary: dict) -> Table | None:
    mem = section(summary, "memory")
    if not mem.get("per_rank"):
        return None
    head = ["rank", "params", "grads", "optimizer", "model states", "activation peak", "peak"]
    rows = [[_f(r.get("rank"))] + _cells(r, _MEMORY_KEYS, fmt_bytes) for r in mem["per_rank"]]
    theory = mem.get("theory")
    title = "memory per rank" + (
        f"; theory {theory.get('formula')} = {fmt_bytes(theory.get('model_states_bytes'))}"
        if theory
        else ""
    )
    return title, head, rows


_WIRE_KEYS = ("intra", "inter", "bytes", "payload_bytes")


def traffic_table(summary: dict) -> Table | None:
    tr = section(summary, "traffic")
    if not tr:
        return None
    # wire bytes: on every link, summed over links and calls of the window (docs/traffic.md)
    head = ["op", "intra-node wire", "inter-node wire", "wire bytes", "payload Σ calls"]
    rows = [
        [str(r.get("op"))] + _cells(r, _WIRE_KEYS, fmt_bytes)
        for r in section_rows(summary, "traffic", "by_op")
    ]
    rows += [
        [f"{row_label(r)} · {r.get('op')}"] + _cells(r, _WIRE_KEYS, fmt_bytes)
        for r in section_rows(summary, "traffic", "by_group")[:MAX_TABLE_ROWS]
    ]
    return (
        (
            f"traffic: {fmt_frac(tr.get('inter_node_fraction'))} of "
            f"{fmt_bytes(tr.get('total_bytes'))} wire bytes (all links, whole window) "
            "on inter-node links"
        ),
        head,
        rows,
    )


_COMPARE_BYTES = ("model_states_bytes", "collective_bytes", "wire_bytes", "inter_node_bytes")


def compare_table(runs: Sequence[tuple[str, dict]]) -> Table:
    """One row per run (tracekit.figures.compare_rows), the comparison report's first table."""
    head = [
        "run",
        "strategy",
        "ranks",
        "step s",
        "compute %",
        "exposed comm %",
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
            *(_pct(r[k], r["span_s"]) for k in ("compute_total_s", "exposed_comm_s", "idle_s")),
            *(fmt_bytes(r[k]) for k in _COMPARE_BYTES),
            fmt_frac(r["bubble_fraction"]),
            fmt_frac(r["allgather_hidden_fraction"]),
        ]
        for r in compare_rows(runs)
    ]
    return "comparison", head, rows


#: The sections of one run's report: (title, figure names, table builder, the no-data key
#: of tracekit.figures.NO_DATA; None: the section is left out when it has no figure).
SECTIONS: list[tuple[str, list[str], Callable[[dict], Table | None] | None, str | None]] = [
    ("time per rank", ["breakdown"], None, None),
    ("timeline", ["timeline"], None, "timeline"),
    ("pipeline", ["pipeline", "pipeline_stages"], pipeline_table, "pipeline"),
    ("overlap of all-gather / reduce-scatter with compute", ["overlap"], overlap_table, "overlap"),
    ("memory", ["memory"], memory_table, "memory"),
    ("traffic", ["traffic_split", "traffic_matrix"], traffic_table, "traffic_split"),
    (
        "collectives",
        ["collective_bandwidth", "collective_time"],
        collectives_table,
        "collective_bandwidth",
    ),
    (
        "what if the network were slower (tracekit predict)",
        ["predict_curve"],
        None,
        None,
    ),
]
