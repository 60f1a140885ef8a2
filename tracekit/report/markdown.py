"""The Markdown report: every table of every run (and the comparison), no figures."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracekit.analyses import manifest
from tracekit.report.claims import claims
from tracekit.report.progress import Progress
from tracekit.report.tables import Table, compare_table, rank_table, table_of, top_events


def _md_cell(text: Any) -> str:
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _md_table(t: Table) -> list[str]:
    title, head, rows = t
    lines = [f"**{_md_cell(title)}**", ""]
    if not rows:
        return lines + ["_no rows_", ""]
    lines.append("| " + " | ".join(_md_cell(h) for h in head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def write_md(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    lines = ["# tracekit report", ""]
    summaries = [(n, a.summary) for n, a in zip(names, analyses)]
    if len(analyses) > 1:
        lines += ["## comparison", ""] + _md_table(compare_table(summaries))
        checked = claims(analyses)
        if checked:
            lines += ["### the papers' claims on these runs", ""]
            lines += [f"- {_md_cell(c.line())}" for c in checked] + [""]
    for name, a in zip(names, analyses):
        s = a.summary
        lines += [f"## {_md_cell(name)}", "", f"source: {_md_cell(a.path)}", ""]
        if s.why is not None:  # the diagnosis heads the run (tracekit why)
            lines += ["**why**", ""] + [f"- {_md_cell(d)}" for d in s.why.diagnosis] + [""]
        for w in s.warnings:
            lines.append(f"- warning: {_md_cell(w)}")
        lines.append("")
        lines += _md_table(rank_table(s))
        for section in manifest.REPORT:
            table_fn = table_of(section)
            if table_fn is None:
                continue  # figures only: nothing for a table format
            lines += [f"### {_md_cell(section.title)}", ""]
            t = table_fn(s)
            if t:
                lines += _md_table(t)
            elif section.no_data:
                lines += [f"_{section.no_data}_", ""]
        lines += _md_table(top_events(a.event_totals))
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
