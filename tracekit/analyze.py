"""One call from a path to the summary and the polars frames, in four steps:

    job = load(path)             tracekit.ingest.load: the only reader of the run folder
    inp = prepare(job)           tracekit.analyses.prepare: the timeline step (process groups,
                                 collectives, clock alignment, windows, segments)
    results = run_sections(inp)  tracekit.analyses.registry: every section of summary.json
    assemble(inp, results)       the summary dict, and the Analysis that holds it

tracekit.analysis_folder writes an Analysis to disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import msgspec
import polars as pl

from tracekit import runfolder, timeline
from tracekit.analyses.prepare import prepare
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.ingest.job import Job
from tracekit.ingest.kineto_info import TraceInfo
from tracekit.ingest.load import load
from tracekit.summary import Summary, to_struct

#: summary.json's first sections, in the order schema 1 has always written them; the other
#: sections follow in the registry's order
LEADING_SECTIONS = ("ranks", "collectives", "pipeline", "overlap", "traffic")


@dataclass
class Analysis:
    """Everything `tracekit analyze` computes: the summary dict and the frames behind it."""

    path: Path
    summary: dict[str, Any]
    events: pl.DataFrame
    ranks: pl.DataFrame  # one row per rank: the breakdown
    timeline: pl.DataFrame  # merged state segments: rank, start_ns, end_ns, state
    collectives: pl.DataFrame  # one row per collective call per rank
    infos: list[TraceInfo] = field(default_factory=list)
    run: dict[str, Any] | None = None  # run.json as written
    frames: dict[str, pl.DataFrame] = field(
        default_factory=dict
    )  # from the sections: pipeline_ops, ...
    job: Job | None = None  # what was loaded (tracekit.ingest.load)

    @cached_property
    def typed_summary(self) -> Summary:
        """The summary checked against tracekit.summary's schema once (ValidationError on drift);
        figures, reports and the app read its attributes. ``summary`` must not change after."""
        return to_struct(self.summary)

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "ranks": self.ranks,
            "timeline": self.timeline,
            "collectives": self.collectives,
            "events": self.events,
            **self.frames,
        }


def analyze(
    path: str | Path,
    ranks_per_node: int | None = None,
    ranks: Sequence[int] | None = None,
    workers: int | None = None,
    align_clocks: bool | None = None,
    sample: int | None = None,
    cache: bool | None = None,
    cache_dir: Path | None = None,
    scheduler: str | None = None,
) -> Analysis:
    """Analyse a run folder, a folder of Kineto traces, or one trace file.

    ``sample``: a sampled overview, N ranks spread over the job (first and last included;
    tracekit.ingest.selection); the summary's ``sampling`` and a warning say which.
    ``cache`` (tracekit.ingest.cache, the parsed events as parquet): None uses entries that match the
    traces as they are now (in ``cache_dir``, default the per-user cache folder, or beside them
    when their run wrote them) and writes none; True also writes one for every trace it parses,
    into ``cache_dir``; False neither reads nor writes.

    ``align_clocks``: None aligns rank clocks when the traces come from several hosts, True
    always, False never (offsets are reported in summary ``clock`` either way; tracekit.clock).

    ``scheduler`` (default ``$TRACEKIT_SCHEDULER``): where the per-rank parse runs,
    "threads", "processes" or a Dask scheduler address (tracekit.engines); the summary then
    records it under ``engine``. None: tracekit chooses, and the summary has no ``engine``.
    """
    from tracekit import engines

    scheduler = engines.resolve(scheduler)
    # cache entries are written while the analysis runs, and are all on disk when it returns
    with (
        ThreadPoolExecutor(1, thread_name_prefix="tracekit-cache") as cache_writer,
        engines.open_executor(scheduler, workers) if scheduler else nullcontext() as engine,
    ):
        job = load(
            path,
            ranks_per_node=ranks_per_node,
            ranks=ranks,
            sample=sample,
            workers=workers,
            cache=cache,
            cache_dir=cache_dir,
            cache_writer=cache_writer,
            executor=engine[0] if engine else None,
        )
        inp = prepare(job, align_clocks)
        result = assemble(inp, run_sections(inp))
    if engine:
        result.summary["engine"] = msgspec.to_builtins(engine[1])
    return result


def run_sections(inp: SectionInput) -> dict[str, SectionResult]:
    """Every section of tracekit.analyses.registry on INP, in its order."""
    from tracekit.analyses.registry import SECTIONS

    return {key: build(inp) for key, build in SECTIONS.items()}


def assemble(inp: SectionInput, results: Mapping[str, SectionResult]) -> Analysis:
    """summary.json and the Analysis from the timeline step and the sections' results."""
    job, windows = inp.job, inp.windows
    warnings = list(inp.warnings)
    frames: dict[str, pl.DataFrame] = {}
    for result in results.values():
        warnings.extend(result.warnings)
        frames.update(result.frames)
    kinds = windows["kind"].unique().to_list()
    summary: dict[str, Any] = {
        "schema_version": runfolder.SUMMARY_SCHEMA_VERSION,
        "source": str(job.path),
        "warnings": warnings,
        "window": {
            "kind": "complete_steps" if kinds == ["complete_steps"] else "whole_trace",
            "steps": inp.steps,
            "start_ns": int(cast(int, windows["start_ns"].min())),
            "end_ns": int(cast(int, windows["end_ns"].max())),
            "per_rank": windows.drop("cutoff_ns").to_dicts(),
        },
        "topology": {
            "source": job.topology.source,
            "nodes": {str(r): n for r, n in inp.nodes.items()},
        },
        "clock": inp.clock,
        "sampling": job.selection.summary(),
        "run": None if job.run is None else job.run.echo(),
        **dict.fromkeys(LEADING_SECTIONS),
        **{key: result.value for key, result in results.items()},
    }
    return Analysis(
        path=job.path,
        summary=summary,
        events=inp.events,
        ranks=frames.pop("ranks"),
        timeline=timeline.merge_states(inp.segments),
        collectives=inp.collectives,
        infos=inp.infos,
        run=None if job.run is None else job.run.raw,
        frames=frames,
        job=job,
    )
