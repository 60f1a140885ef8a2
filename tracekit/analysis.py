"""One call from a path to the summary and the polars frames, in four steps:

    job = load(path, options)    tracekit.ingest.load: the only reader of the run folder, as
                                 the ReadOptions say; the per-rank read runs on the engine
                                 (tracekit.engines)
    inp = prepare(job)           tracekit.analyses.prepare: the timeline step (process groups,
                                 collectives, clock alignment; then per rank, on the engine,
                                 windows, segments and what the sections need of them)
    results = run_sections(inp)  tracekit.analyses.manifest: every section of summary.json,
                                 each returning its Struct
    assemble(inp, results)       the Summary (tracekit.summary), and the Analysis that holds it

tracekit.analysis_folder writes an Analysis to disk. The driver holds the slim events and
the per-rank results; every rank's events and merged timeline wait where the map left them
(tracekit.ingest.spill) and are read when asked for (``Analysis.events``, ``.timeline``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
import polars as pl

if TYPE_CHECKING:
    import plotly.graph_objects as go

from tracekit import clock, engines, runfolder, stopping
from tracekit.analyses import manifest
from tracekit.analyses.event_totals import event_totals
from tracekit.analyses.prepare import MapFn, prepare
from tracekit.analyses.section import RankResult, RankTask, SectionInput, SectionResult
from tracekit.ingest.cache_paths import folder as cache_folder
from tracekit.ingest.job import Job
from tracekit.ingest.kineto_info import TraceInfo
from tracekit.ingest.load import load
from tracekit.ingest.rank_scan import ReadProgress
from tracekit.ingest.read_options import ReadOptions
from tracekit.ingest.spill import EventsRef, Spill
from tracekit.summary import Summary, to_builtins
from tracekit.summary.ranks import Run, Sampling, Window, WindowRank
from tracekit.summary.schema import Engine
from tracekit.summary.traffic import Topology

#: the merged timeline's columns (tracekit.timeline.merge_states)
TIMELINE_SCHEMA = {"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "state": pl.Utf8}

T = TypeVar("T")


@dataclass
class Analysis:
    """Everything `tracekit analyze` computes: the typed summary and the frames behind it.

    ``summary`` is summary.json as a Struct (tracekit.summary.Summary): read its attributes,
    ``a.summary.pipeline.bubble_fraction``; :meth:`summary_dict` is the same as plain dicts and
    lists (the JSON API: ``json.dumps(a.summary_dict())`` is summary.json's content)."""

    path: Path
    summary: Summary
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    """The sections' frames by name (tracekit.analyses.manifest): ranks, collectives,
    pipeline_ops, ...; written as analysis/<name>.parquet."""
    # rank -> where its events / merged timeline wait (tracekit.ingest.spill), in rank order
    events_at: dict[int, EventsRef] = field(default_factory=dict)
    timeline_at: dict[int, EventsRef] = field(default_factory=dict)
    shifts: dict[int, int] = field(default_factory=dict)  # rank -> clock offset (tracekit.clock)
    totals: pl.DataFrame | None = None  # tracekit.analyses.event_totals, reduced over the ranks
    infos: list[TraceInfo] = field(default_factory=list)
    run: dict[str, Any] | None = None  # run.json as written
    job: Job | None = None  # what was loaded (tracekit.ingest.load)

    @property
    def typed_summary(self) -> Summary:
        """The former name of :attr:`summary` (when it was a dict), kept while code written
        against it moves over."""
        return self.summary

    def summary_dict(self) -> dict[str, Any]:
        """summary.json's content as dicts and lists, keys in its order."""
        return to_builtins(self.summary)

    def frame(self, name: str) -> pl.DataFrame:
        """A section's frame by name (tracekit.analyses.manifest); empty, with its declared
        columns, when the run has none."""
        found = self.frames.get(name)
        return found if found is not None else manifest.empty_frame(name)

    # --- the notebook front door: what the app and the reports show, from here ----------------

    def figure(self, name: str) -> go.Figure | None:
        """Figure NAME, as the app and the reports draw it (``breakdown``, ``timeline``,
        ``pipeline``, ``overlap``, ``memory``, ``traffic_matrix``, ...: tracekit.analyses.manifest);
        None when this run has no data for it (``tracekit.figures.NO_DATA[name]`` says so)."""
        from tracekit import figures

        if name not in figures.FIGURES:
            raise KeyError(f"no figure {name!r}; the figures are {', '.join(figures.FIGURES)}")
        return figures.FIGURES[name](self)

    def report(self, out: str | Path, fmt: str | None = None) -> Path:
        """Write this run's report to OUT (the format from its name: .html, .pdf, .png, .md,
        .json, .csv, .parquet, .perfetto.json; or FMT) atomically; returns OUT."""
        from tracekit.report import write_report

        return write_report([self], out, fmt)

    def predict(
        self,
        inter_node_bandwidth: str | float | None = None,
        intra_node_bandwidth: str | float | None = None,
        latency_us: float = 0.0,
        out: str | Path | None = None,
        write: bool = True,
    ) -> dict[str, Any]:
        """This run's step on another network (`tracekit predict`, docs/predict.md); writes
        prediction.json into ``out`` (default RUN/analysis) unless ``write`` is False."""
        from tracekit.prediction import predict_of

        return predict_of(self, inter_node_bandwidth, intra_node_bandwidth, latency_us, out, write)

    def _repr_html_(self) -> str:
        """What Jupyter shows for an Analysis: the run, its per-rank table, each section's
        headline and the names of its figures (tracekit.report.notebook)."""
        from tracekit.report.notebook import summary_html

        return summary_html(self)

    @property
    def ranks(self) -> pl.DataFrame:
        """One row per rank: the breakdown (summary.json ``ranks[]`` as a table)."""
        return self.frame("ranks")

    @property
    def collectives(self) -> pl.DataFrame:
        """One row per collective call per rank, matched across ranks."""
        return self.frame("collectives")

    def rank_events(self, rank: int) -> pl.LazyFrame:
        """One rank's events, clocks aligned, as a lazy plan over where they wait."""
        return clock.shifted(self.events_at[rank].lazy(), {rank: self.shifts.get(rank, 0)})

    def rank_tables(self) -> dict[str, dict[int, pl.LazyFrame]]:
        """The per-rank tables (written as <name>/rank<R>.parquet): every rank's events and
        merged timeline, each a lazy plan over where it waits."""
        return {
            "events": {r: self.rank_events(r) for r in self.events_at},
            "timeline": {r: ref.lazy() for r, ref in self.timeline_at.items()},
        }

    @cached_property
    def events(self) -> pl.DataFrame:
        """Every event of the ranks analysed, clocks aligned: read back when first asked for
        (the report's top events, Perfetto export, predict), as big as the traces."""
        from tracekit.events import EVENT_SCHEMA

        return _collect([self.rank_events(r) for r in self.events_at], EVENT_SCHEMA)

    @cached_property
    def timeline(self) -> pl.DataFrame:
        """Merged state segments of every rank: rank, start_ns, end_ns, state."""
        return _collect([ref.lazy() for ref in self.timeline_at.values()], TIMELINE_SCHEMA)

    @cached_property
    def event_totals(self) -> pl.DataFrame:
        """count and total_ns per event name, kind and device (tracekit.analyses.event_totals):
        computed per rank by the map; from ``events`` for an Analysis built without them."""
        return self.totals if self.totals is not None else event_totals(self.events)

    def close(self) -> None:
        """Remove the scratch folder where ranks' events and timelines wait (tracekit.ingest.spill):
        ``events``, ``timeline`` and the per-rank tables cannot be read after, unless already
        read. Otherwise it goes when the Analysis does, or at the end of the process (a command
        that leaves by ``os._exit`` must call this)."""
        if self.job is not None and self.job.spill is not None:
            self.job.spill.close()

    def tables(self) -> dict[str, pl.DataFrame]:
        """The frames written beside summary.json (the per-rank ones: :meth:`rank_tables`)."""
        return dict(self.frames)


def _collect(plans: list[pl.LazyFrame], schema: Mapping[str, Any]) -> pl.DataFrame:
    """The ranks' plans read into one frame, in order (empty, with SCHEMA, without any)."""
    if not plans:
        return pl.DataFrame(schema=schema)
    return pl.concat(plans, how="vertical").collect()


def analyze(
    path: str | Path,
    options: ReadOptions | None = None,
    *,
    ranks_per_node: int | None = None,
    ranks: Sequence[int] | None = None,
    workers: int | None = None,
    align_clocks: bool | None = None,
    sample: int | None = None,
    cache: bool | None = None,
    cache_dir: Path | None = None,
    scheduler: str | None = None,
    progress: ReadProgress | None = None,
) -> Analysis:
    """Analyse a run folder, a folder of Kineto traces, or one trace file.

    How to read it: ``options`` (a tracekit.ingest.read_options.ReadOptions, as the CLI builds
    one), or the keywords below, which make one (not both); each is documented there.

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

    ``progress(files_read, files, bytes_read, bytes)``: called after each trace file is read
    (the CLI's progress line; sizes are the files' on disk).
    """
    given = ReadOptions.of(
        ranks_per_node=ranks_per_node,
        ranks=ranks,
        workers=workers,
        align_clocks=align_clocks,
        sample=sample,
        cache=cache,
        cache_dir=cache_dir,
        scheduler=scheduler,
    )
    if options is not None and given != ReadOptions():
        raise TypeError("analyze(): give the read options as ReadOptions or as keywords, not both")
    options = options or given
    scheduler = engines.resolve(options.scheduler)
    spill = Spill(_spill_root(scheduler, options.cache_dir))
    workers = options.workers
    # cache entries are written while the analysis runs, and are all on disk when it returns
    with (
        stopping.ThreadPool(1, "tracekit-cache") as cache_writer,
        engines.open_executor(scheduler, workers) if scheduler else nullcontext() as engine,
    ):
        executor = engine[0] if engine else None
        job = load(
            path, options, cache_writer=cache_writer, executor=executor, spill=spill,
            progress=progress,
        )  # fmt: skip
        inp = prepare(job, options.align_clocks, _map_on(executor, workers))
        ran = None if engine is None else _typed(msgspec.to_builtins(engine[1]), Engine)
        result = assemble(inp, run_sections(inp), ran)
    return result


def predict(
    path: str | Path,
    inter_node_bandwidth: str | float | None = None,
    intra_node_bandwidth: str | float | None = None,
    latency_us: float = 0.0,
    out: str | Path | None = None,
    analysis: Analysis | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """`tracekit predict` of one run (docs/predict.md): PATH analysed (or ANALYSIS, already
    made), then :meth:`Analysis.predict`."""
    a = analysis if analysis is not None else analyze(path)
    return a.predict(inter_node_bandwidth, intra_node_bandwidth, latency_us, out, write)


def _spill_root(scheduler: str | None, cache_dir: Path | None) -> Path:
    """Where per-rank results wait (tracekit.ingest.spill): ``$TRACEKIT_SPILL_DIR``; else, on a
    Dask cluster, the cache folder (workers must share it with the driver: a home or project
    folder usually is); else this machine's temporary folder."""
    chosen = os.environ.get("TRACEKIT_SPILL_DIR", "").strip()
    if chosen:
        return Path(chosen)
    if scheduler and scheduler not in engines.LOCAL_ENGINES:
        return cache_folder(cache_dir)
    return Path(tempfile.gettempdir())


def _map_on(executor: Executor | None, workers: int | None) -> MapFn:
    """The per-rank map: the batch held in memory here (its events are here), the ranks whose
    events wait in files on EXECUTOR (default: threads of this process), meanwhile."""

    def run(fn: Callable[[RankTask], RankResult], tasks: Iterable[RankTask]) -> list[RankResult]:
        tasks = list(tasks)
        here = [t for t in tasks if t.folder is None]
        away = [t for t in tasks if t.folder is not None]
        if not away:
            return [fn(t) for t in here]
        with (
            nullcontext(executor)
            if executor is not None
            else stopping.ThreadPool(workers or engines.usable_cpus(), "tracekit-rank") as pool
        ):
            pending = pool.map(fn, away)
            return [fn(t) for t in here] + list(pending)

    return run


def run_sections(inp: SectionInput) -> dict[str, SectionResult[Any]]:
    """Every section of tracekit.analyses.manifest on INP, in its order. A stop request (Ctrl-C,
    the app's timeout: tracekit.stopping) is honoured between sections, not only in the read."""
    out: dict[str, SectionResult[Any]] = {}
    for s in manifest.SECTIONS:
        if s.key and s.compute:
            stopping.check()
            out[s.key] = s.compute(inp)
    return out


def assemble(
    inp: SectionInput, results: Mapping[str, SectionResult[Any]], engine: Engine | None = None
) -> Analysis:
    """The Summary and the Analysis from the timeline step and the sections' results."""
    job, windows = inp.job, inp.windows
    warnings = list(inp.warnings)
    frames: dict[str, pl.DataFrame] = {}
    for result in results.values():
        warnings.extend(result.warnings)
        frames.update(result.frames)
    kinds = windows["kind"].unique().to_list()
    window = Window(
        kind="complete_steps" if kinds == ["complete_steps"] else "whole_trace",
        steps=inp.steps,
        start_ns=int(cast(int, windows["start_ns"].min())),
        end_ns=int(cast(int, windows["end_ns"].max())),
        per_rank=msgspec.convert(
            windows.drop("cutoff_ns").to_dicts(), list[WindowRank], strict=True
        ),
    )
    sections: dict[str, Any] = {key: result.value for key, result in results.items()}
    summary = Summary(
        schema_version=runfolder.SUMMARY_SCHEMA_VERSION,
        source=str(job.path),
        warnings=warnings,
        window=window,
        topology=Topology(
            source=job.topology.source, nodes={str(r): n for r, n in inp.nodes.items()}
        ),
        clock=inp.clock,
        sampling=_typed(job.selection.summary(), Sampling),
        run=None if job.run is None else _typed(job.run.echo(), Run),
        engine=engine,
        **sections,
    )
    return Analysis(
        path=job.path,
        summary=summary,
        frames=frames,
        events_at={i.rank: job.rank_events[i.rank] for i in inp.infos},
        timeline_at=dict(inp.per_rank.timeline),
        shifts=dict(inp.shifts),
        totals=inp.per_rank.event_totals,
        infos=inp.infos,
        run=None if job.run is None else job.run.raw,
        job=job,
    )


def _typed(value: dict[str, Any] | None, struct: type[T]) -> T | None:
    """A part of summary.json that ingest gives as a dict, as its Struct (checked)."""
    return None if value is None else msgspec.convert(value, struct, strict=True)
