"""The HTML report: one self-contained, offline page of every run (and the comparison).

plotly.js is embedded once (the first figure carries it, the others reference it), tables are
escaped HTML. Trace strings are never concatenated into markup unescaped: cells go through
``html.escape``, figure data through plotly's JSON (which writes ``<`` as ``\\u003c``). The PDF
and PNG reports (tracekit.report.static) place the same figures as static images instead.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from tracekit.analyses import manifest
from tracekit.figures import compare_figures, figures_for
from tracekit.report.claims import HOLDS, claims
from tracekit.report.overview import anchor, overview_html
from tracekit.report.progress import Progress
from tracekit.report.tables import Table, compare_table, rank_table, table_of, top_events

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto; max-width: 1200px;
       color: #222; padding: 0 16px; }
h1 { font-size: 24px; } h2 { font-size: 20px; border-bottom: 1px solid #ddd; padding-top: 12px; }
h3 { font-size: 16px; margin-top: 22px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.caption { font-weight: 600; margin-top: 8px; } .nodata { color: #777; font-style: italic; }
.warn { color: #8a5a00; } .src { color: #555; font-size: 13px; } .fig { margin: 8px 0; }
.fig img { display: block; width: 100%; height: auto; }
table { width: 100%; table-layout: auto; } th, td { overflow-wrap: break-word; }  /* wraps at spaces; numbers stay whole */
.toc ul { columns: 2; margin: 4px 0 16px; padding-left: 18px; font-size: 13px; }
.toc .sub { color: #555; font-size: 12px; } .findings li { margin: 3px 0; }
h2, h3, .caption { break-after: avoid; page-break-after: avoid; }
.fig, table, tr, .toc li { break-inside: avoid; page-break-inside: avoid; }
@media print { body { max-width: none; margin: 0; } table { font-size: 10px; }
  th, td { padding: 2px 4px; } h2 { break-before: page; } h2#what-the-runs-show { break-before: auto; } }
"""

Figures = dict[str, go.Figure | None]


def svg_uri(svg: bytes) -> str:
    """An SVG image as a ``data:`` URI."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def html_table(t: Table) -> str:
    """A report table as HTML, every cell escaped."""
    title, head, rows = t
    out = [f'<div class="caption">{html.escape(title)}</div>']
    if not rows:
        return out[0] + '<p class="nodata">no rows</p>'
    out.append(
        "<table><thead><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
    )
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


class FigureSink:
    """Turns figures into HTML: interactive (plotly.js embedded once) or static images."""

    def __init__(self, images: dict[int, bytes] | None = None) -> None:
        self.images = images
        self.first = True

    def __call__(self, fig: Any) -> str:
        if self.images is not None:
            return (
                f'<div class="fig"><img alt="figure" src="{svg_uri(self.images[id(fig)])}"></div>'
            )
        import plotly.io as pio

        height = fig.layout.height or 420
        div = pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=self.first,
            default_height=f"{height}px",
            config={"displaylogo": False, "responsive": True},
        )
        self.first = False
        return f'<div class="fig">{div}</div>'


def report_figures(analyses: Sequence[Any], names: Sequence[str]) -> tuple[Figures, list[Figures]]:
    """The comparison's figures (several runs) and every run's, its prediction's included."""
    summaries = [(n, a.summary) for n, a in zip(names, analyses)]
    compare = compare_figures(summaries) if len(analyses) > 1 else {}
    per_run = [figures_for(a) for a in analyses]  # the prediction's sweep too, when it has one
    return compare, per_run


def _run_line(a: Any) -> str:
    """Where the run comes from and what it ran."""
    s = a.summary
    desc = f"source: {a.path}"
    if s.run:
        run = s.run
        desc += (
            f" · strategy {run.strategy} · {run.world_size} ranks · {run.backend}"
            f" · {run.device} · {run.precision}"
        )
    return desc + f" · window: {s.window.kind}, {s.window.steps} steps"


def html_doc(
    analyses: Sequence[Any],
    names: Sequence[str],
    figure_html: Callable[[Any], str],
    compare: Figures,
    per_run: list[Figures],
    *,
    tables: bool = True,
) -> str:
    """The report page; ``figure_html`` places each figure (interactive or as an image)."""
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>tracekit report: {html.escape(', '.join(names))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>tracekit report</h1>",
        "",  # the overview and contents list, filled in once every heading is known
    ]
    contents: list[tuple[str, str, int]] = []

    def heading(level: int, title: str, *within: str) -> str:
        ident = anchor(*within, title)
        if any(c[0] == ident for c in contents):  # two runs of one name: still one target each
            ident += f"-{len(contents)}"
        contents.append((ident, title, level))
        return f'<h{level} id="{ident}">{html.escape(title)}</h{level}>'

    summaries = [(n, a.summary) for n, a in zip(names, analyses)]
    if len(analyses) > 1:
        parts.append(heading(2, "comparison"))
        if tables:
            parts.append(html_table(compare_table(summaries)))
        for fig in compare.values():
            if fig is not None:
                parts.append(figure_html(fig))
        checked = claims(analyses)
        if checked:  # the papers' claims on these runs (tracekit.report.claims)
            parts.append(heading(3, "the papers' claims on these runs"))
            items = "".join(
                f'<li class="{"ok" if c.verdict == HOLDS else "warn"}">{html.escape(c.line())}</li>'
                for c in checked
            )
            parts.append(f'<ul class="claims">{items}</ul>')
    for name, a, figs in zip(names, analyses, per_run):
        s = a.summary
        parts.append(heading(2, name, "run"))
        parts.append(f'<p class="src">{html.escape(_run_line(a))}</p>')
        if s.why is not None:  # the diagnosis heads the run (tracekit why)
            items = "".join(f"<li>{html.escape(d)}</li>" for d in s.why.diagnosis)
            parts.append(f'<ul class="why">{items}</ul>')
        if tables:
            for w in s.warnings:
                parts.append(f'<p class="warn">warning: {html.escape(str(w))}</p>')
            parts.append(html_table(rank_table(s)))
        for section in manifest.REPORT:
            table_fn = table_of(section)
            present = [figs[f.name] for f in section.figures if figs.get(f.name) is not None]
            if not present and section.no_data is None and table_fn is None:
                continue  # an optional section (the prediction) this run has nothing for
            if not section.figures and not tables:
                continue  # a table-only section (contention) in a page without tables
            t = table_fn(s) if (table_fn and tables) else None
            parts.append(heading(3, section.title, "run", name))
            if not present and section.no_data and not t:
                parts.append(f'<p class="nodata">{html.escape(section.no_data)}</p>')
                continue
            for fig in present:
                parts.append(figure_html(fig))
            if t:
                parts.append(html_table(t))
        if tables:
            parts.append(heading(3, "events", "run", name))
            parts.append(html_table(top_events(a.event_totals)))
    parts[5] = overview_html(summaries, contents)
    parts.append("<p class='src'>written by tracekit</p></body></html>")
    return "\n".join(parts)


def write_html(
    analyses: Sequence[Any], names: Sequence[str], tmp: Path, progress: Progress | None
) -> None:
    compare, per_run = report_figures(analyses, names)
    doc = html_doc(analyses, names, FigureSink(), compare, per_run)
    tmp.write_text(doc, encoding="utf-8")
