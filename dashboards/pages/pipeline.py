"""``/pipeline``: the pipeline schedule (F/B/W, bubbles, replay, theory), bubbles per stage, and
the pipeline table."""

from __future__ import annotations

from dashboards.pages.common import View, figure, graph, nodata, run_header, table_if
from tracekit import figures as F
from tracekit import report as R


def page(view: View) -> list:
    entry = view.run
    schedule, stages = figure(entry, "pipeline"), figure(entry, "pipeline_stages")
    kids = [run_header(view)]
    if schedule is None and stages is None:
        return kids + [nodata(F.NO_DATA["pipeline"])]
    if schedule is not None:
        kids.append(graph(schedule, "fig-pipeline"))
    if stages is not None:
        kids.append(graph(stages, "fig-pipeline-stages"))
    return kids + table_if(R.pipeline_table(entry.analysis.typed_summary))
