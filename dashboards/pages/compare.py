"""``/compare?run=a&run=b``: several runs side by side, the comparison table and figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dash import html

from dashboards.pages.common import View, graph, nodata, table
from dashboards.root import Refused
from tracekit import figures as F
from tracekit import report as R
from tracekit.errors import TracekitError
from tracekit.report.claims import HOLDS, claims
from tracekit.runname import names_for


def page(view: View) -> list:
    if len(view.chosen) < 1:
        return [nodata("choose two or more runs to compare")]
    loaded: list[tuple[str, Any]] = []
    kids: list[Any] = []
    for rel in view.chosen:
        try:
            loaded.append((rel, view.runs.entry(rel).analysis))
        except Refused as exc:
            return [html.P(str(exc), className="refusal")]
        except TracekitError as exc:
            kids.append(
                html.P(f"could not analyse {rel}: {view.runs.message(exc)}", className="warn")
            )
    if not loaded:
        return kids
    # display names ("zero3 (prefetch 0)" / "(prefetch 1)"), not folder names that look alike
    names = names_for([(Path(a.path), a.run) for _, a in loaded])
    checked = claims([a for _, a in loaded])
    loaded = [(n, a.summary) for n, (_, a) in zip(names, loaded)]
    kids.append(table(R.compare_table(loaded), "compare-table"))
    if checked:  # the papers' claims on these runs (tracekit.report.claims)
        kids.append(html.H3("the papers' claims on these runs"))
        items = [
            html.Li(c.line(), className="ok" if c.verdict == HOLDS else "warn") for c in checked
        ]
        kids.append(html.Ul(items, id="claims"))
    for name, fig in F.compare_figures(loaded).items():
        if fig is not None:
            kids.append(graph(fig, f"fig-{name.replace('_', '-')}"))
    return kids
