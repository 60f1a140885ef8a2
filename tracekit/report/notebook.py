"""An analysis shown in a notebook: the compact summary Jupyter displays (``Analysis._repr_html_``).

What ran and where its time went, in one screen: the run, its window and warnings, the per-rank
table of the report, one line per section the run has (the headline number of each, "–" when
unknown), and the names of the figures ``analysis.figure(name)`` draws for it. Every text from a
trace is escaped.
"""

from __future__ import annotations

import html
from typing import Any

from tracekit.analyses import manifest
from tracekit.figures.style import UNKNOWN, fmt_bytes, fmt_frac, fmt_s
from tracekit.report.page import html_table
from tracekit.report.tables import rank_table
from tracekit.summary import Summary


def _headlines(s: Summary) -> list[str]:
    """One line per section the run has: its headline numbers."""
    out = []
    if s.ranks:
        steps = [r.step_time_s for r in s.ranks if r.step_time_s is not None]
        out.append(f"step time (slowest rank): {fmt_s(max(steps)) if steps else UNKNOWN}")
    if s.pipeline is not None:
        p = s.pipeline
        out.append(
            f"pipeline ({p.schedule}, p={p.stages}, m={p.microbatches}): bubble "
            f"{fmt_frac(p.bubble_fraction)}, replay {fmt_frac(p.bubble_fraction_replay)}, "
            f"theory {fmt_frac(p.bubble_fraction_theory)}"
        )
    if s.overlap is not None:
        out.append(
            f"overlap: all-gather {fmt_frac(s.overlap.allgather_hidden_fraction)} hidden, "
            f"reduce-scatter {fmt_frac(s.overlap.reducescatter_hidden_fraction)} hidden"
        )
    if s.memory is not None:
        states = [r.model_states_bytes for r in s.memory.per_rank if r.model_states_bytes]
        out.append(
            f"memory: model states {fmt_bytes(max(states)) if states else UNKNOWN} per rank, "
            f"measured / formula {fmt_frac(s.memory.ratio_to_theory)}"
        )
    if s.traffic is not None:
        out.append(
            f"traffic: {fmt_bytes(s.traffic.total_bytes)} on links, inter-node "
            f"{fmt_frac(s.traffic.inter_node_fraction)}"
        )
    if s.collectives.count:
        out.append(
            f"collectives: {s.collectives.calls} calls matched, {fmt_bytes(s.collectives.bytes)}"
        )
    return out


def summary_html(analysis: Any) -> str:
    """The compact HTML summary of one Analysis (its ``summary`` and ``path``)."""
    s: Summary = analysis.summary
    bits = [f"{len(s.ranks)} ranks", f"window: {s.window.kind}, {s.window.steps} steps"]
    if s.run is not None:
        bits = [f"strategy {s.run.strategy}", f"{s.run.backend} / {s.run.device}", *bits]
    parts = [
        "<div class='tracekit-analysis'>",
        f"<p><b>tracekit analysis</b> of <code>{html.escape(str(analysis.path))}</code>: "
        f"{html.escape(' · '.join(str(b) for b in bits))}</p>",
    ]
    parts += [f"<p style='color:#8a5a00'>warning: {html.escape(w)}</p>" for w in s.warnings]
    parts.append(html_table(rank_table(s)))
    parts.append("<ul>" + "".join(f"<li>{html.escape(h)}</li>" for h in _headlines(s)) + "</ul>")
    names = ", ".join(manifest.figures())
    parts.append(f"<p>figures: <code>analysis.figure(name)</code>, name one of {names}</p>")
    parts.append("</div>")
    return "\n".join(parts)
