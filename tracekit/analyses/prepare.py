"""The timeline step: from a Job to the frames every section reads (a SectionInput).

In order: process groups (tracekit.analyses.groups: the Job's flight records, run.json's groups,
each trace's pg_config), every collective call matched across ranks
(tracekit.analyses.collectives), clock offsets between hosts (tracekit.clock: when applied,
the calls are matched again on the moved times), then per rank the analysis window, the
compute/communication intervals and the elementary segments (tracekit.timeline). Ranks
without any compute or communication event in their window are left out, with a warning;
collectives are then matched without them.
"""

from __future__ import annotations

import polars as pl

from tracekit import clock, timeline
from tracekit.analyses import collectives, groups
from tracekit.analyses.section import SectionInput
from tracekit.errors import TracekitError
from tracekit.ingest.job import Job


def prepare(job: Job, align_clocks: bool | None = None) -> SectionInput:
    """The timeline step (see the module docstring). ``align_clocks``: None aligns rank clocks
    when the traces come from several hosts, True always, False never."""
    infos, events = job.infos, job.events
    nodes = dict(job.topology.nodes)
    warnings = list(job.warnings)
    gpu_ranks = {i.rank for i in infos if i.has_gpu}
    group_sizes = {i.rank: int(i.world_size) for i in infos if i.world_size}
    sources = groups.GroupSources.of(job)
    raw = collectives.raw_collectives(events, group_sizes, sources)
    events, sources, clock_summary, clock_warn = clock.align(
        events, infos, sources, raw[0], align_clocks
    )
    if clock_summary and clock_summary.get("applied"):  # times moved: match again
        raw = collectives.raw_collectives(events, group_sizes, sources)
    warnings.extend(clock_warn)

    windows = timeline.analysis_windows(events, gpu_ranks)
    warnings.extend(timeline.marker_warnings(events))
    iv = timeline.intervals(events, windows, gpu_ranks, raw[0])
    windows = timeline.refine_gpu_windows(windows, iv, gpu_ranks)
    empty = windows.filter(pl.col("start_ns").is_null() | pl.col("end_ns").is_null())[
        "rank"
    ].to_list()
    if len(empty) == windows.height:
        raise TracekitError(
            "the traces hold no compute or communication events: nothing to analyse", job.path
        )
    if empty:  # a rank with only metadata/annotations: say so and leave it out
        warnings.append(
            f"ranks {empty}: no compute or communication events in the window; left out"
        )
        keep = ~pl.col("rank").is_in(empty)
        windows, iv, events = windows.filter(keep), iv.filter(keep), events.filter(keep)
        raw = collectives.raw_collectives(events, group_sizes, sources)  # without them
        infos = [i for i in infos if i.rank not in empty]
        nodes = {r: n for r, n in nodes.items() if r not in empty}
    seg = timeline.segments(iv, windows)
    markers = timeline.step_markers(events)
    coll, coll_warn = collectives.collectives_table(raw, windows)
    warnings = groups.drop_resolved_warnings(warnings, coll) + coll_warn
    return SectionInput(
        job=job,
        infos=infos,
        events=events,
        windows=windows,
        segments=seg,
        markers=markers,
        collectives=coll,
        nodes=nodes,
        clock=clock_summary,
        warnings=tuple(warnings),
    )
