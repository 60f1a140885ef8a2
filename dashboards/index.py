"""The Dash index's table of runs: one row per run under ROOT, sortable, each linking to its page.

    strategy      the display name (tracekit.runname), as ``tracekit compare`` and the demo name it
    ranks         ranks analysed (run.json world_size before the analysis is there)
    status        run.json status (ok / failed / timeout / running); "analysing…" until known
    step s        median step time over ranks                         (figures.compare_rows)
    exposed comm  exposed communication, mean over ranks, as a share of the mean span
                  (the comparison table's "exposed comm %", report.compare_table)
    bubble        pipelines: summary pipeline.bubble_fraction
    all-gather    ZeRO / FSDP: summary overlap.allgather_hidden_fraction
    hidden

Every number is read from the run's analysis summary, through figures.compare_rows; nothing is
computed here but the one share above. Unknown or not applicable is null, shown as "–", and
sorts last. Summaries come from, in order: the app's own analysis cache, the run's
``analysis/summary.json`` when it is newer than every trace and run.json (what ``tracekit
analyze`` and the demo write), else one background thread analyses the run; the page polls
until every row is in, so the index shows at once however many runs need analysing.
"""

from __future__ import annotations

import os
import queue
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dash import dash_table, dcc, html
from dash.dash_table.Format import Format, Scheme, Symbol

from dashboards.root import Refused
from dashboards.runs import Runs
from tracekit import figures as F
from tracekit import runfolder, runname
from tracekit.errors import TracekitError
from tracekit.ingest import guarded_read
from tracekit.summary import Summary, from_json

UNKNOWN = "–"
PENDING = "analysing…"
POLL_MS = 1000
_MARKDOWN = set("\\`*_{}[]()#+-.!|<>~")

COLUMNS: list[dict[str, Any]] = [
    {"id": "run", "name": "run", "presentation": "markdown"},
    {"id": "strategy", "name": "strategy"},
    {"id": "ranks", "name": "ranks", "type": "numeric", "format": Format(nully=UNKNOWN)},
    {"id": "status", "name": "status"},
    {
        "id": "step_s",
        "name": "step time",
        "type": "numeric",
        "format": Format(precision=4, scheme=Scheme.fixed, nully=UNKNOWN)
        .symbol(Symbol.yes)
        .symbol_suffix(" s"),
    },
    {
        "id": "exposed",
        "name": "exposed comm",
        "type": "numeric",
        "format": Format(precision=1, scheme=Scheme.percentage, nully=UNKNOWN),
    },
    {
        "id": "bubble",
        "name": "bubble",
        "type": "numeric",
        "format": Format(precision=1, scheme=Scheme.percentage, nully=UNKNOWN),
    },
    {
        "id": "allgather_hidden",
        "name": "all-gather hidden",
        "type": "numeric",
        "format": Format(precision=1, scheme=Scheme.percentage, nully=UNKNOWN),
    },
    {"id": "why", "name": "diagnosis"},  # summary.json why.diagnosis[0]: the top cause
]


def _md_text(text: str) -> str:
    """Text as Markdown that renders as itself (a folder name is never markup or a link)."""
    return "".join("\\" + c if c in _MARKDOWN else c for c in text)


def _link(rel: str) -> str:
    href = "/?" + urllib.parse.urlencode([("run", rel)])  # always a path of this app
    return f"[{_md_text(rel)}]({href})"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def row(
    rel: str, name: str, run: Mapping[str, Any] | None, summary: Summary | None, status: str
) -> dict[str, Any]:
    """One table row; ``summary`` None: every number unknown."""
    world = run.get("world_size") if isinstance(run, Mapping) else None
    out: dict[str, Any] = {
        "id": rel,
        "run": _link(rel),
        "strategy": name,
        "ranks": world if isinstance(world, int) and world > 0 else None,
        "status": status,
        "step_s": None,
        "exposed": None,
        "bubble": None,
        "allgather_hidden": None,
        "why": UNKNOWN,
    }
    if summary is None:
        return out
    (r,) = F.compare_rows([(name, summary)])
    span, exposed = _number(r["span_s"]), _number(r["exposed_comm_s"])
    out.update(
        ranks=r["ranks"] or out["ranks"],
        step_s=_number(r["step_time_s"]),
        # the comparison's "exposed comm %": exposed / span, both means over ranks
        exposed=exposed / span if exposed is not None and span else None,
        bubble=_number(r["bubble_fraction"]),
        allgather_hidden=_number(r["allgather_hidden_fraction"]),
    )
    why = getattr(summary, "why", None)
    if why is not None and why.diagnosis:
        out["why"] = why.diagnosis[0]
    return out


def _disk_summary(path: Path, signature: tuple) -> Summary | None:
    """analysis/summary.json of a run folder if it is of every rank and newer than its inputs
    (and of this tracekit's schema: an older one is analysed again)."""
    if not path.is_dir():
        return None
    file = runfolder.analysis_dir(path) / "summary.json"
    try:
        mtime = file.stat().st_mtime_ns
        if any(m > mtime for _, m, _ in signature):
            return None
        data = from_json(guarded_read.read_json_bytes(file))  # no FIFO, /dev/zero, deep JSON
    except (OSError, ValueError, TracekitError):  # msgspec.ValidationError is a ValueError
        return None
    if data.sampling is not None:
        return None  # a sampled analysis does not stand for the run
    return data


class Summaries:
    """Summaries of the runs of a dashboards.runs.Runs, analysed one at a time in the background."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self._done: dict[tuple, Summary | str] = {}  # key -> summary, or why there is none
        self._queued: set[tuple] = set()
        self._lock = threading.Lock()
        self._todo: queue.Queue[tuple[tuple, Path]] = queue.Queue()
        self._worker: threading.Thread | None = None

    def _work(self) -> None:
        from tracekit.analysis import analyze

        try:  # Linux niceness is per thread: the pages a user waits for go first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            key, path = self._todo.get()
            try:
                result: Summary | str = analyze(path).summary
            except TracekitError as exc:
                result = self.runs.message(exc)
            except Exception as exc:  # noqa: BLE001 - one bad run must not stop the index
                result = f"analysis failed ({type(exc).__name__})"
            with self._lock:
                self._done[key] = result
                self._queued.discard(key)

    def _ask(self, key: tuple, path: Path) -> None:
        with self._lock:
            if key in self._queued:
                return
            self._queued.add(key)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="tracekit-index", daemon=True
                )
                self._worker.start()
        self._todo.put((key, path))

    def get(self, path: Path) -> Summary | str | None:
        """The run's summary, a reason there is none, or None while it is being analysed."""
        key = (str(path), self.runs._signature(path))
        with self._lock:
            if key in self._done:
                return self._done[key]
        cached = self.runs.cached(key)
        found = cached.analysis.summary if cached is not None else _disk_summary(path, key[1])
        if found is not None:
            with self._lock:
                self._done[key] = found
            return found
        self._ask(key, path)
        return None

    def rows(self) -> tuple[list[dict[str, Any]], bool]:
        """The index rows of every listed run, and whether some are still being analysed."""
        items: list[tuple[str, Path, dict | None, Summary | str | None, str | None]] = []
        for rel in self.runs.list_runs():
            if rel in self.runs.preloaded:
                a = self.runs.preloaded[rel].analysis
                items.append((rel, Path(rel), a.run, a.summary, None))
                continue
            try:
                path = self.runs.resolve(rel)
            except Refused:
                items.append((rel, Path(rel), None, None, "refused"))
                continue
            assert isinstance(path, Path)  # a name (str) only for the preloaded, done above
            run = runname.load_run(path)
            items.append((rel, path, run, self.get(path), None))
        names = runname.names_for([(path, run) for _, path, run, _, _ in items])
        out, pending = [], False
        for (rel, _, run, summary, refused), name in zip(items, names):
            status = (run or {}).get("status") or UNKNOWN
            if refused:
                status, summary = refused, None
            elif summary is None:
                status, pending = PENDING, True
            elif isinstance(summary, str):
                status, summary = f"{status}; not analysable: {summary}", None
            try:
                out.append(row(rel, name, run, summary, str(status)))
            except (TypeError, ValueError, AttributeError, KeyError):
                out.append(row(rel, name, run, None, f"{status}; summary unreadable"))
        return out, pending


def table(rows: list[dict[str, Any]], pending: bool) -> html.Div:
    """The sortable index table, and the poll that fills it in while runs are being analysed."""
    return html.Div(
        [
            # dash/dash_table/__init__.py opens with "# type: ignore": mypy sees none of its names
            dash_table.DataTable(  # type: ignore[attr-defined]
                id="index-table",
                columns=COLUMNS,
                data=rows,
                sort_action="native",
                sort_mode="single",
                markdown_options={"html": False, "link_target": "_self"},
                style_cell={
                    "fontSize": "13px",
                    "padding": "4px 10px",
                    "fontFamily": 'system-ui, -apple-system, "Segoe UI", sans-serif',
                    "fontVariantNumeric": "tabular-nums",
                },
                # a Markdown cell is a paragraph: no margins, so its row is as tall as the others
                css=[{"selector": ".dash-cell-value p", "rule": "margin: 0;"}],
                style_cell_conditional=[
                    {"if": {"column_id": c}, "textAlign": "left"}
                    for c in ("run", "strategy", "status")
                ],
                style_header={"fontWeight": "600", "backgroundColor": "#f4f4f4"},
                style_table={"overflowX": "auto"},
            ),
            dcc.Interval(id="index-poll", interval=POLL_MS, disabled=not pending),
        ],
        id="run-list",
    )
