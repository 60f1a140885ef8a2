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
analyze`` and the demo write), else the run is analysed. Reading and analysing happen in a
bounded pool in the background (a few runs at a time, each failed after the app's analysis
timeout: "analysis took longer than N s"); the page polls until every row is in, so the index
shows at once however many runs need analysing, and one run whose read never returns (a FIFO)
holds no other.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dash import dash_table, dcc, html
from dash.dash_table.Format import Format, Scheme, Symbol

from dashboards.pool import Job, Pool
from dashboards.root import Refused
from dashboards.runs import Runs
from tracekit import figures as F
from tracekit import guarded_read, runfolder, runname
from tracekit.errors import TracekitError
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


#: analyses for the index at once; each also bounded by the app's analysis timeout
INDEX_WORKERS = 3
#: how long a run just asked for may hold the rows (a summary on disk is read in that time):
#: quick ones show at once, the others as "analysing…" until a poll finds them done
QUICK_S = 0.5

# run.json (None: none or unreadable), and the summary or why there is none
Found = tuple[dict | None, Summary | str]


class Summaries:
    """Summaries of the runs of a dashboards.runs.Runs, read and analysed in the background: in
    a pool of INDEX_WORKERS threads (dashboards.pool), each run failed after the app's analysis
    timeout ("analysis took longer than N s"), so one run whose read never returns holds only
    itself. Nothing of a run folder is read in the request's thread but the files' sizes."""

    def __init__(self, runs: Runs) -> None:
        self.runs = runs
        self.pool = Pool(INDEX_WORKERS, runs.pool.timeout_s, "tracekit-index", nice=10)
        self._done: dict[tuple, Found] = {}  # key -> run.json and summary, or why there is none
        self._jobs: dict[tuple, Job] = {}
        self._run_of: dict[tuple, dict | None] = {}  # run.json as soon as read (for a timeout)
        self._lock = threading.Lock()

    def _read(self, key: tuple, path: Path) -> Found:
        """run.json and the summary of the run at PATH (in a pool thread)."""
        from tracekit.analysis import analyze

        run = runname.load_run(path)
        with self._lock:
            for old in [k for k in self._run_of if k[0] == key[0]]:
                del self._run_of[old]
            self._run_of[key] = run
        found = _disk_summary(path, key[1])
        if found is None:
            try:
                found = analyze(path).summary
            except TracekitError as exc:
                return run, self.runs.message(exc)
        return run, found

    def _ask(self, path: Path) -> Found | Job:
        key = (str(path), self.runs._signature(path))
        with self._lock:
            if key in self._done:
                return self._done[key]
        cached = self.runs.cached(key)
        if cached is not None:
            return cached.analysis.run, cached.analysis.summary
        why = self.runs.timed_out(key)  # the run's page found it runs past the timeout
        with self._lock:
            if why is not None:
                self._done[key] = (self._run_of.get(key), why)
                return self._done[key]
            job = self._jobs.get(key)
            if job is None:
                job = self.pool.submit(key, lambda: self._read(key, path))
                for old in [k for k in self._jobs if k[0] == key[0]]:
                    del self._jobs[old]
                self._jobs[key] = job
            return job

    def _outcome(self, job: Job) -> Found:
        """A finished job's run.json and summary (or why not), kept from now on."""
        key = job.key
        if job.error is None:
            found: Found = job.value
        else:
            if job.timed_out:
                self.runs.note_timeout(key, job.error)
                why = job.error
            elif isinstance(job.exception, TracekitError):
                why = self.runs.message(job.exception)
            elif job.exception is not None:
                why = f"analysis failed ({type(job.exception).__name__})"
            else:
                why = job.error  # stopped, or the pool full of stuck reads
            with self._lock:
                found = (self._run_of.get(key), why)
        with self._lock:
            self._done[key] = found
            if self._jobs.get(key) is job:
                del self._jobs[key]
        return found

    def get(self, path: Path) -> Summary | str | None:
        """The run's summary, a reason there is none, or None while it is being analysed."""
        got = self._ask(path)
        if isinstance(got, Job):
            return self._outcome(got)[1] if got.done else None
        return got[1]

    def rows(self) -> tuple[list[dict[str, Any]], bool]:
        """The index rows of every listed run, and whether some are still being analysed."""
        items: list[tuple[str, Path, dict | None, Summary | str | None, str | None]] = []
        asked: list[tuple[str, Path, Found | Job | None]] = []
        for rel in self.runs.list_runs():
            if rel in self.runs.preloaded:
                a = self.runs.preloaded[rel].analysis
                asked.append((rel, Path(rel), (a.run, a.summary)))
                continue
            try:
                path = self.runs.resolve(rel)
            except Refused:
                asked.append((rel, Path(rel), None))
                continue
            assert isinstance(path, Path)  # a name (str) only for the preloaded, done above
            asked.append((rel, path, self._ask(path)))
        for rel, path, got in asked:
            if isinstance(got, Job) and not got.done:
                got.wait(max(0.0, got.created + QUICK_S - time.monotonic()))
            if got is None:
                items.append((rel, path, None, None, "refused"))
            elif isinstance(got, Job) and not got.done:
                items.append((rel, path, None, None, None))
            else:
                found = self._outcome(got) if isinstance(got, Job) else got
                items.append((rel, path, found[0], found[1], None))
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
