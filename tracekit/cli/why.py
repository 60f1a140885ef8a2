"""``tracekit why PATH``: why the step takes its time, in a few lines (summary.json ``why``).

The first line names the rank that holds the others up (Böhme et al.'s delay analysis), then
the step time, the critical path's main share and the top waits (tracekit.analyses.why)."""

from __future__ import annotations

from pathlib import Path

import click


def diagnosis_lines(summary) -> list[str]:  # summary: tracekit.summary.Summary
    """The diagnosis of a summary; one line saying there is none without a window."""
    why = getattr(summary, "why", None)
    return list(why.diagnosis) if why is not None else ["no diagnosis: the run has no window"]


@click.command("why")
@click.argument("path", type=click.Path(path_type=Path))
def why_cmd(path: Path) -> None:
    """Say why PATH's step takes its time: who waits on whom, the cause, the critical path."""
    from tracekit.analysis import analyze
    from tracekit.cli.tables import safe

    result = analyze(path)
    try:
        for line in diagnosis_lines(result.summary):
            click.echo(safe(line))  # op and run names come from traces: no raw escapes
    finally:
        result.close()
