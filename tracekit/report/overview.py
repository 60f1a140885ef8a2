"""The report's first section: in a few lines, what the runs show, and the contents list.

Every number is read from the summaries through tracekit.figures.compare_rows (defined once in
tracekit/summary/); this module only picks the extremes and says them. Unknown values drop out
of a line ("–" where a line must show one), never count as 0.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from typing import Any

from tracekit.figures.compare import compare_rows
from tracekit.figures.style import fmt_bytes
from tracekit.summary import Summary

Run = tuple[str, Summary]


def anchor(*names: str) -> str:
    """A stable HTML id for a heading (run name, section title): letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(names).lower()).strip("-") or "section"


def _known(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [r for r in rows if isinstance(r.get(key), int | float)]


def _extreme(
    rows: list[dict[str, Any]], key: str, fmt: Callable[[Any], str], pick: Callable = max
) -> str | None:
    known = _known(rows, key)
    if not known:
        return None
    r = pick(known, key=lambda r: r[key])
    return f"{html.escape(str(r['run']))} ({fmt(r[key])})"


def _share(r: dict[str, Any], key: str) -> float | None:
    span, part = r.get("span_s"), r.get(key)
    if isinstance(span, int | float) and isinstance(part, int | float) and span > 0:
        return part / span
    return None


def findings(runs: Sequence[Run]) -> list[str]:
    """The lines of "what the runs show" (HTML-escaped), one per finding that has numbers."""
    rows = compare_rows(runs)
    for r in rows:
        r["exposed_share"] = _share(r, "exposed_comm_s")
        r["waiting_share"] = _share(r, "waiting_s")
    out = []
    step = _known(rows, "step_time_s")
    if len(step) > 1:
        out.append(
            f"fastest step: {_extreme(rows, 'step_time_s', lambda v: f'{v:.4g} s', min)}; "
            f"slowest: {_extreme(rows, 'step_time_s', lambda v: f'{v:.4g} s')} "
            "(median profiled step)"
        )
    elif step:
        out.append(f"step: {_extreme(rows, 'step_time_s', lambda v: f'{v:.4g} s')}")
    line = _extreme(rows, "bubble_fraction", lambda v: f"{v:.1%} of the pipeline idle")
    if line:
        out.append(f"biggest pipeline bubble: {line}")
    line = _extreme(rows, "exposed_share", lambda v: f"{v:.1%} of the window")
    if line:
        out.append(f"most exposed communication (not hidden behind compute): {line}")
    line = _extreme(rows, "waiting_share", lambda v: f"{v:.1%} of the window")
    if line:
        out.append(f"most time waiting on peers (moving no bytes): {line}")
    line = _extreme(rows, "peak_bytes", lambda v: html.escape(fmt_bytes(v)))
    if line:
        small = _extreme(rows, "peak_bytes", lambda v: html.escape(fmt_bytes(v)), min)
        out.append(f"largest measured memory peak (one rank): {line}; smallest: {small}")
    line = _extreme(rows, "allgather_hidden_fraction", lambda v: f"{v:.1%} hidden")
    if line:
        out.append(f"best all-gather overlap: {line}")
    return out


def overview_html(runs: Sequence[Run], contents: Sequence[tuple[str, str, int]]) -> str:
    """The first section and the contents list: ``contents`` is (id, title, level) per heading."""
    lines = findings(runs)
    parts = ['<nav class="toc" id="contents"><div class="caption">contents</div><ul>']
    parts.append('<li><a href="#what-the-runs-show">what the runs show</a></li>')
    # a run's sections on one line under it: 12 runs x 10 sections would be a page of links
    groups: list[list[str]] = []
    for ident, title, level in contents:
        link = f'<a href="#{ident}">{html.escape(title)}</a>'
        if level == 2 or not groups:
            groups.append([link])
        else:
            groups[-1].append(link)
    for head, *subs in groups:
        sub = f"<br><span class='sub'>{' · '.join(subs)}</span>" if subs else ""
        parts.append(f"<li>{head}{sub}</li>")
    parts.append("</ul></nav>")
    n = len(runs)
    parts.append(f'<h2 id="what-the-runs-show">what the runs show ({n} run{"s" * (n != 1)})</h2>')
    parts.append("<ul class='findings'>" + "".join(f"<li>{x}</li>" for x in lines) + "</ul>")
    if not lines:
        parts.append('<p class="nodata">no step, bubble, communication or memory numbers</p>')
    return "\n".join(parts)
