"""Every analysis, declared once: one :class:`Section` record each, everything it is made of.

    key       its summary.json key, the field of tracekit.summary.Summary (None: a view of the
              per-rank frames only, such as the timeline)
    struct    that field's type: its Struct of tracekit.summary
    compute   SectionInput -> SectionResult[struct] (tracekit.analyses.section): a pure function
    frames    the frames it returns, name -> schema, written as analysis/<name>.parquet
    title     its heading in reports and on its page
    figures   what the app, the reports and ``Analysis.figure(name)`` draw, each a builder
              ``(analysis) -> go.Figure | None`` of tracekit.figures and the sentence said
              instead when the run has none
    table     its table of the Summary in tracekit.report.tables, or None
    no_data   what a report says when the run has nothing for it (None: left out)

:data:`SECTIONS` runs them (this order is that of summary.json's warnings); :data:`REPORT` is
the order a report reads them in; :data:`PAGES` are the app's pages for them. The figures and the
table live above this layer (tracekit.figures, tracekit.report): a record names them, as
``"module:function"`` in tracekit.figures and a function of tracekit.report.tables, and each
layer looks its own up; tests/test_manifest.py checks that every record is complete and that
every name resolves.

Adding an analysis: its module here (compute), its Struct in tracekit.summary (and the field on
Summary), its figure builders in tracekit.figures if any, a table if any, and its record below,
named in SECTIONS, REPORT and (to show it in the app) a page of PAGES (CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit.analyses import (
    breakdown,
    collectives,
    collectives_section,
    contention,
    critical_path,
    matching,
    memory,
    overlap,
    pipeline,
    pipeline_bubble,
    pipeline_ops,
    pipeline_schedule,
    root_causes,
    traffic_section,
    volume,
    wait_states,
    why,
)
from tracekit.analyses.section import Compute
from tracekit.summary.collectives import Collectives, Matching, Volume
from tracekit.summary.contention import Contention, Steps
from tracekit.summary.memory import Memory, Overlap
from tracekit.summary.nccl import Nccl
from tracekit.summary.pipeline import Pipeline
from tracekit.summary.ranks import Rank
from tracekit.summary.traffic import Traffic
from tracekit.summary.why import Why

#: a frame's columns and their types
Schema = Mapping[str, Any]


@dataclass(frozen=True)
class Figure:
    """One figure of a section."""

    name: str
    """Its name: ``Analysis.figure(name)``, the app's graph ``fig-<name>``, a report's figure."""
    build: str
    """``"module:function"`` in tracekit.figures: ``(analysis) -> go.Figure | None`` (None when
    the run has no data for it)."""
    no_data: str
    """What the app says instead of it when the run has none ("this run has no ...")."""


@dataclass(frozen=True, eq=False)  # each record is one of its kind: compared by identity
class Section:
    """One analysis: its summary.json key, Struct, computation, frames and how it is shown."""

    key: str | None
    """Its summary.json key and Summary field; None for a view of frames only."""
    title: str
    """Its heading in reports and on its page."""
    struct: Any = None
    """The Summary field's type: a Struct of tracekit.summary (``list[Rank]`` for ``ranks``)."""
    compute: Compute | None = None
    """Its pure function of the timeline step's output (tracekit.analyses.section)."""
    frames: Mapping[str, Schema] = field(default_factory=dict)
    """The frames it returns, name -> schema, declared here only."""
    figures: tuple[Figure, ...] = ()
    """Its figures, in the order they are shown."""
    table: str | None = None
    """Its table: a function of tracekit.report.tables, ``(Summary) -> Table | None``."""
    no_data: str | None = None
    """What a report says when the run has none of its figures (None: it is left out)."""


@dataclass(frozen=True)
class Page:
    """A page of the app (dashboards): its path, its label in the navigation bar, its sections
    in the order shown."""

    path: str
    label: str
    sections: tuple[Section, ...]


NO_RANKS = "this run has no per-rank data"
NO_TIMELINE = "this run has no timeline data"
NO_PIPELINE = "this run has no pipeline data"
NO_OVERLAP = "this run has no overlap data (ZeRO-3 / FSDP / HSDP runs have it)"
NO_MEMORY = "this run has no memory data"
NO_TRAFFIC = "this run has no traffic data"
NO_COLLECTIVES = "this run has no collectives data"
NO_WHY = "this run has no critical path (no window)"
NO_WAITS = "this run has no waits on other ranks"
NO_PREDICTION = "this run has no matched collective or p2p calls to predict from"
NO_CONTENTION = (
    "this run has no contention files (tracekit run's ranks write them; other traces do not)"
)

RANKS = Section(
    "ranks",
    "time per rank",
    struct=list[Rank],
    compute=breakdown.ranks_section,
    frames={"ranks": breakdown.RANKS_SCHEMA},
    figures=(Figure("breakdown", "breakdown:breakdown_of", NO_RANKS),),
)
TIMELINE = Section(
    None,
    "timeline",
    figures=(Figure("timeline", "timeline:timeline_of", NO_TIMELINE),),
    no_data=NO_TIMELINE,
)
COLLECTIVES = Section(
    "collectives",
    "collectives",
    struct=Collectives,
    compute=collectives_section.collectives_section,
    frames={"collectives": collectives.COLLECTIVES_SCHEMA},
    figures=(
        Figure("collective_bandwidth", "collectives:bandwidth_of", NO_COLLECTIVES),
        Figure("collective_time", "collectives:time_of", NO_COLLECTIVES),
    ),
    table="collectives_table",
    no_data=NO_COLLECTIVES,
)
PIPELINE = Section(
    "pipeline",
    "pipeline",
    struct=Pipeline,
    compute=pipeline.pipeline,
    frames={
        "pipeline_ops": pipeline_ops.OPS_SCHEMA,
        "bubbles": pipeline_bubble.BUBBLES_SCHEMA,
        "pipeline_replay": pipeline_schedule.REPLAY_SCHEMA,
    },
    figures=(
        Figure("pipeline", "pipeline:schedule_of", NO_PIPELINE),
        Figure("pipeline_stages", "pipeline:stages_of", NO_PIPELINE),
    ),
    table="pipeline_table",
    no_data=NO_PIPELINE,
)
TRAFFIC = Section(
    "traffic",
    "traffic",
    struct=Traffic,
    compute=traffic_section.traffic,
    frames={"traffic_links": traffic_section.LINKS_SCHEMA},
    figures=(
        Figure("traffic_split", "traffic:split_of", NO_TRAFFIC),
        Figure("traffic_matrix", "traffic:matrix_of", NO_TRAFFIC),
    ),
    table="traffic_table",
    no_data=NO_TRAFFIC,
)
NCCL = Section("nccl", "NCCL", struct=Nccl, compute=traffic_section.nccl)
MATCHING = Section(
    "matching",
    "matching",
    struct=Matching,
    compute=traffic_section.matching_section,
    frames={"collective_matches": matching.MATCHES_SCHEMA},
)
MEMORY = Section(
    "memory",
    "memory",
    struct=Memory,
    compute=memory.memory,
    figures=(Figure("memory", "memory:memory_of", NO_MEMORY),),
    table="memory_table",
    no_data=NO_MEMORY,
)
OVERLAP = Section(
    "overlap",
    "overlap of all-gather / reduce-scatter with compute",
    struct=Overlap,
    compute=overlap.overlap,
    frames={"overlap_units": overlap.FRAME_SCHEMA},
    figures=(Figure("overlap", "overlap:overlap_of", NO_OVERLAP),),
    table="overlap_table",
    no_data=NO_OVERLAP,
)
VOLUME = Section("volume", "volume", struct=Volume, compute=volume.volume)
PREDICTION = Section(
    None,
    "what if the network were slower (tracekit predict)",
    figures=(Figure("predict_curve", "prediction:curve_for", NO_PREDICTION),),
)
CONTENTION = Section(
    "contention",
    "CPU contention (waiting for a CPU)",
    struct=Contention,
    compute=contention.contention,
    table="contention_table",
    no_data=NO_CONTENTION,
)
STEPS = Section(
    "steps",
    "step time and its noise",
    struct=Steps,
    compute=contention.steps,
    frames={"steps": contention.STEPS_SCHEMA},
)
WHY = Section(
    "why",
    "why: wait states, root causes, critical path",
    struct=Why,
    compute=why.why_section,
    frames={
        "wait_states": wait_states.WAITS_SCHEMA,
        "wait_matrix": why.MATRIX_SCHEMA,
        "rank_states": wait_states.STATES_SCHEMA,
        "root_causes": root_causes.CAUSES_SCHEMA,
        "critical_path": critical_path.PATH_SCHEMA,
    },
    figures=(
        Figure("why_path", "why:path_of", NO_WHY),
        Figure("why_matrix", "why:matrix_of", NO_WAITS),
    ),
    table="why_table",
)

#: Every section of summary.json, in the order they run (that of their warnings).
SECTIONS: tuple[Section, ...] = (
    RANKS,
    COLLECTIVES,
    PIPELINE,
    TRAFFIC,
    NCCL,
    MATCHING,
    MEMORY,
    OVERLAP,
    VOLUME,
    CONTENTION,
    STEPS,
    WHY,
)

#: What a report shows of one run, in order (figures, table or the no-data sentence).
REPORT: tuple[Section, ...] = (
    RANKS,
    TIMELINE,
    PIPELINE,
    OVERLAP,
    MEMORY,
    TRAFFIC,
    COLLECTIVES,
    PREDICTION,
    WHY,
    CONTENTION,
)

#: The app's pages of sections, in the order of its navigation bar (after the index and the
#: timeline, before compare: dashboards.pages).
PAGES: tuple[Page, ...] = (
    Page("/pipeline", "pipeline", (PIPELINE,)),
    Page("/overlap", "overlap & memory", (OVERLAP, MEMORY)),
    Page("/traffic", "traffic", (TRAFFIC, COLLECTIVES, PREDICTION)),
    Page("/why", "why", (WHY, CONTENTION)),
)


def by_key() -> dict[str, Section]:
    """The sections of summary.json by key."""
    return {s.key: s for s in SECTIONS if s.key is not None}


def figures() -> dict[str, Figure]:
    """Every figure of one run by name, in the order of :data:`REPORT`."""
    return {f.name: f for s in REPORT for f in s.figures}


def frame_schemas() -> dict[str, Schema]:
    """Every frame the sections return, name -> schema (analysis/<name>.parquet)."""
    return {name: schema for s in SECTIONS for name, schema in s.frames.items()}


def empty_frame(name: str) -> pl.DataFrame:
    """Frame NAME with no rows, its declared columns."""
    return pl.DataFrame(schema=frame_schemas()[name])
