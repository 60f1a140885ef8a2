"""The terminal side of the CLI: the two consoles and tables that fit them.

Progress and logs go to stderr (:data:`err`); results (tables, the run folder's path) to stdout
(:func:`out`). Tables are stacked to fit the width (:func:`fit_tables`), so numbers are never cut.

Names come from the user's disk and traces: a run folder named ``\x1b]0;title\x07`` would set
the terminal's title, ``\x1b[31m`` its colour (issue #24). Every string the consoles print or
show on their status line, and every table cell, goes through :func:`safe` first: control
characters are shown escaped, never sent (the error line of tracekit.cli.main too).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group
from rich.markup import escape
from rich.status import Status
from rich.table import Table
from rich.text import Text

from tracekit.summary import Summary

# C0 (but tab and newline), DEL, C1 (0x9b is a CSI of its own), the bidi controls that
# reorder what a line shows, and lone surrogates (a name's bytes that are not UTF-8: shown as
# \xff, never a UnicodeEncodeError); in one line (a cell, an error) tab and newline too
_CONTROL = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_IN_TEXT = re.compile(f"[{_CONTROL}]")
_IN_LINE = re.compile(f"[{_CONTROL}\t\n]")


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte of a name that is not UTF-8 (os.fsdecode's surrogate)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: str, one_line: bool = True) -> str:
    """TEXT with its control characters written as ``\\x1b`` / ``\\u202e`` (repr's form), so
    that it shows on a terminal as what it is; ``one_line=False`` keeps tab and newline."""
    return (_IN_LINE if one_line else _IN_TEXT).sub(_escaped, text)


class _SafeStatus(Status):
    def update(self, status: Any = None, **kwargs: Any) -> None:
        super().update(safe(status, False) if isinstance(status, str) else status, **kwargs)


class SafeConsole(Console):
    """A rich Console whose strings (print's, the status line's) go through :func:`safe`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(safe(text, False), **kwargs)

    def status(self, status: Any, **kwargs: Any) -> Status:
        return _SafeStatus(
            safe(status, False) if isinstance(status, str) else status, console=self, **kwargs
        )


# stderr: when it is not a terminal (a log, a pipe, CI) lines are never wrapped, so that one
# warning is one line whatever its length
err = SafeConsole(stderr=True) if sys.stderr.isatty() else SafeConsole(stderr=True, soft_wrap=True)


def out() -> Console:
    """stdout console: the terminal's width, or COLUMNS; wide (160) when piped without COLUMNS.
    Tables are stacked to fit whatever width this is (fit_tables), so numbers are never cut."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return SafeConsole()
    return SafeConsole(width=160)


def _share(v: float, span: float) -> str:
    """Seconds, with their percent of the span when there is one."""
    return f"{v:.4f} ({100 * v / span:.0f}%)" if span else f"{v:.4f}"


def rank_table(summary: Summary, width: int | None = None) -> Group:
    """The per-rank breakdown (seconds, and percent of span), stacked to fit ``width``: compute,
    transfer, waiting on peers, other, idle (report.tables.rank_table says why)."""
    win = summary.window
    head = ["rank", "node", "span s", "step s", "compute", "transfer", "overlap"]
    head += ["exposed transfer", "waiting on peers", "other", "idle"]
    waits = {w.rank: w for w in (summary.why.wait_states.per_rank if summary.why else [])}
    rows = []
    for r in summary.ranks:
        span = r.span_s or 0.0
        step = r.step_time_s
        w = waits.get(r.rank)
        transfer = r.comm_s if w is None else w.comm_transfer_s
        exposed = r.exposed_comm_s if w is None else w.transfer_s
        rows.append(
            [
                str(r.rank),
                str(r.node),
                f"{span:.4f}",
                "–" if step is None else f"{step:.4f}",
                *(_share(v or 0.0, span) for v in (r.compute_s, transfer, r.overlap_s, exposed)),
                "–" if w is None else _share(w.waiting_s, span),
                _share(r.other_s or 0.0, span),
                _share(r.idle_s or 0.0, span),
            ]
        )
    title = f"per-rank breakdown ({win.kind}, {win.steps} steps)"
    return fit_tables(title, head, rows, keys=2, width=width)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def pipeline_table(summary: Summary) -> Group | None:
    """The pipeline section (bubbles per stage against theory and replay), if the run has one."""
    p = summary.pipeline
    if p is None:
        return None
    title = (
        f"pipeline {p.schedule}: p={p.stages} m={p.microbatches}  bubble "
        f"{_pct(p.bubble_fraction)} (replay {_pct(p.bubble_fraction_replay)}, theory "
        f"{_pct(p.bubble_fraction_theory)}), whole span {_pct(p.bubble_fraction_span)}"
    )
    head = ["stage", "rank", "fill s", "steady s", "drain s", "bubble", "in flight"]
    head += ["act peak MB", "versions", "recv wait s", "recv transfer s"]
    rows = [
        [
            str(s.stage),
            str(s.rank),
            f"{s.fill_s:.4f}",
            f"{s.steady_s:.4f}",
            f"{s.drain_s:.4f}",
            _pct(s.bubble_fraction),
            str(s.max_inflight_microbatches),
            "-" if s.activation_peak_bytes is None else f"{s.activation_peak_bytes / 1e6:.2f}",
            "-" if s.weight_versions is None else str(s.weight_versions),
            f"{s.recv_wait_s:.4f}",
            f"{s.recv_transfer_s:.4f}",
        ]
        for s in p.per_stage
    ]
    return fit_tables(title, head, rows, keys=2)


def comparison_table(names: list[str], results: list, width: int | None = None) -> Group:
    """Several runs side by side (tracekit.report.compare_table), stacked to fit ``width``.

    The names are display names (tracekit.runname), which start with the strategy, so the
    strategy column is left out; bubble and all-gather hidden come next to the time columns."""
    from tracekit.report import compare_table

    title, head, rows = compare_table([(n, r.summary) for n, r in zip(names, results)])
    order = [i for i, h in enumerate(head) if h != "strategy"]
    for moved in ("bubble", "all-gather hidden"):
        if moved in head:
            order.remove(head.index(moved))
            order.insert(order.index(head.index("idle %")) + 1, head.index(moved))
    head = [head[i] for i in order]
    rows = [[row[i] for i in order] for row in rows]
    return fit_tables(title, head, rows, keys=1, width=width, left=1)


def print_claims(results: list) -> None:
    """The papers' claims on these runs (tracekit.report.claims), one line each, on stdout."""
    from tracekit.report.claims import HOLDS, claims

    checked = claims(results)
    if checked:
        out().print("the papers' claims on these runs:", highlight=False)
    for c in checked:
        mark = "[green]✓[/]" if c.verdict == HOLDS else "[yellow]✗[/]"
        out().print(f"  {mark} {escape(c.line())}", highlight=False)  # wrapped at the width


def fit_tables(
    title: str,
    head: list[str],
    rows: list[list[str]],
    keys: int = 1,
    width: int | None = None,
    left: int = 0,
) -> Group:
    """Rich tables of these columns, as many as it takes to fit ``width`` (default: the stdout
    console's): the first ``keys`` columns (what names a row) in every one, the others packed in
    order. A cell is never cut or wrapped (each column is at least as wide as its widest cell);
    headers wrap between words."""
    width = width or out().width
    title, head = safe(title), [safe(h) for h in head]
    rows = [[safe(c) for c in row] for row in rows]  # names from disk and traces: never sent raw

    def content(i: int) -> int:  # the widest cell, or the header's longest word
        words = max((cell_len(w) for w in head[i].split()), default=0)
        return max([words, *(cell_len(row[i]) for row in rows)])

    def need(i: int) -> int:  # the column's width in the box: content, padding, one rule
        return content(i) + 3

    base = 1 + sum(need(i) for i in range(keys))
    groups: list[list[int]] = [[]]
    used = base
    for i in range(keys, len(head)):
        if groups[-1] and used + need(i) > width:
            groups.append([])
            used = base
        groups[-1].append(i)
        used += need(i)
    tables: list[Text | Table] = [Text(title)]  # once, wrapped at the console, not each table
    for group in groups:
        cols = [*range(keys), *group]
        widths = {i: content(i) for i in cols}
        slack = width - 1 - sum(w + 3 for w in widths.values())
        # room left: headers on one line, the shortest first (the most headers unwrapped)
        for i in sorted(cols, key=lambda i: cell_len(head[i]) - widths[i]):
            grow = min(max(cell_len(head[i]) - widths[i], 0), slack)
            widths[i] += grow
            slack -= grow
        t = Table()
        for i in cols:
            # a fixed width: rich would otherwise shrink the widest column first, cells included
            t.add_column(
                head[i], justify="left" if i < left else "right", width=widths[i], overflow="fold"
            )
        for row in rows:
            t.add_row(*(Text(row[i]) for i in cols))  # text, never markup
        tables.append(t)
    return Group(*tables)


def read_progress(
    update: Callable[[str], object], what: str, after_s: float = 1.0
) -> Callable[[int, int, int, int], None]:
    """A ReadProgress (tracekit.ingest.rank_scan) that puts "read i/n ranks, X of Y MB" on the
    status line once the read has taken ``after_s``; the status line shows only on a terminal
    (rich draws nothing when stderr is piped)."""
    t0 = time.monotonic()

    def told(done: int, files: int, nbytes: int, total: int) -> None:
        if time.monotonic() - t0 >= after_s:
            update(
                f"analysing {escape(what)}: read {done}/{files} ranks, "
                f"{nbytes / 1e6:.0f} of {total / 1e6:.0f} MB"
            )

    return told
