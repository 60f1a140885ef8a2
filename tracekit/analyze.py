"""One call from a path to the summary and the polars frames: ingest -> timeline -> analyses.

``analyze(path)`` reads; ``write_analysis(result, out)`` writes summary.json and parquet tables
into a temporary folder beside ``out`` and renames it into place, so a reader never sees a
half-written analysis.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import outputs, runfolder, timeline
from tracekit.analyses import breakdown, collectives
from tracekit.errors import TracekitError
from tracekit.events import empty_events as events_empty
from tracekit.ingest import TraceInfo, read_traces
from tracekit.summary import Summary, encode, to_struct
from tracekit.topology import nccl_layout, node_of_ranks


@dataclass(frozen=True)
class Inputs:
    """What every analysis section gets: the frames of the steps before it, read-only."""

    path: Path
    run: dict[str, Any] | None
    infos: list[TraceInfo]
    events: pl.DataFrame
    windows: pl.DataFrame  # rank, kind, steps, start_ns, end_ns, cutoff_ns
    segments: pl.DataFrame  # elementary timeline segments with state (timeline.segments)
    markers: pl.DataFrame  # ProfilerStep markers: rank, step, start_ns, end_ns
    collectives: pl.DataFrame  # one row per collective call per rank
    nodes: dict[int, int]  # rank -> node


# A section: Inputs -> (summary value or None, extra frames, warnings). Each analysis module
# contributes one entry; the summary key is the name in docs/metrics.md.
Section = Callable[[Inputs], "tuple[Any, dict[str, pl.DataFrame], list[str]]"]


def _sections() -> dict[str, Section]:
    """summary key -> section builder (imported lazily so one broken analysis names itself)."""
    from tracekit.analyses import memory, overlap, traffic_section, volume
    from tracekit.analyses import pipeline as pipeline_section

    return {
        "pipeline": pipeline_section.analyse,
        "traffic": traffic_section.traffic,
        "nccl": traffic_section.nccl,
        "matching": traffic_section.matching_section,
        "memory": memory.memory,
        "overlap": overlap.overlap,
        "volume": volume.volume,
    }


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
    run: dict[str, Any] | None = None
    frames: dict[str, pl.DataFrame] = field(
        default_factory=dict
    )  # from the sections: pipeline_ops, ...

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


def _select_ranks(
    files: list[Path],
    ranks: Sequence[int] | None,
    sample: int | None = None,
    cache_dir: Path | None = None,
):
    """The files of the ranks asked for (rank from each file's head, cache or name; files that
    tell it only inside are read and filtered after): tracekit.ingest.selection."""
    from tracekit.ingest.selection import select

    return select(files, ranks, sample, cache_dir)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


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
    ``cache`` (tracekit.cache, the parsed events as parquet): None uses entries that match the
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
    if cache:
        from tracekit import cache as cache_mod

        cache_mod.max_bytes()  # a bad TRACEKIT_CACHE_MAX_BYTES is an error, not ignored
    # cache entries are written while the analysis runs, and are all on disk when it returns
    with (
        ThreadPoolExecutor(1, thread_name_prefix="tracekit-cache") as cache_writer,
        engines.open_executor(scheduler, workers) if scheduler else nullcontext() as engine,
    ):
        result = _analyze(
            Path(path),
            ranks_per_node,
            ranks,
            workers,
            align_clocks,
            sample,
            cache,
            cache_dir,
            cache_writer,
            engine[0] if engine else None,
        )
    if engine:
        result.summary["engine"] = engine[1].as_dict()
    return result


def _analyze(
    path: Path,
    ranks_per_node: int | None,
    ranks: Sequence[int] | None,
    workers: int | None,
    align_clocks: bool | None,
    sample: int | None,
    cache: bool | None,
    cache_dir: Path | None,
    cache_writer: Executor,
    executor: Executor | None = None,
) -> Analysis:
    run = runfolder.load_run_json(path) if runfolder.is_folder(path) else None
    found = runfolder.find_trace_files(path)
    if not found and run is not None:
        raise TracekitError(
            f"no traces in {runfolder.traces_dir(path).name}/: no rank wrote one "
            f"({runfolder.run_status_line(run)})",
            path,
        )
    if not found:
        raise TracekitError("no Kineto trace files (*.json, *.json.gz) found", path)
    from tracekit.ingest.selection import RankSet

    ranks = RankSet.of(ranks)
    selection = _select_ranks(found, ranks, sample, cache_dir)
    files = selection.files
    infos, events = (
        read_traces(
            files,
            workers=workers,
            cache=cache,
            cache_dir=cache_dir,
            cache_writer=cache_writer,
            executor=executor,
        )
        if files
        else ([], events_empty())
    )
    if ranks or selection.sampled is not None:
        keep = (
            set(selection.sampled)
            if selection.sampled is not None
            else {i.rank for i in infos if i.rank in ranks}
        )
        if any(i.rank not in keep for i in infos):  # files that told their rank only inside
            infos = [i for i in infos if i.rank in keep]
            events = events.filter(pl.col("rank").is_in(sorted(keep)))
        if not infos:
            raise TracekitError("none of the ranks asked for (--ranks) has a trace here", path)
    warnings: list[str] = list(selection.warnings)
    for info in infos:
        warnings.extend(f"{info.path.name}: {w}" for w in info.warnings)
    from tracekit.ingest import foreign

    missing = None if ranks or sample else foreign.missing_ranks_warning(infos, run)
    warnings.extend([missing] if missing else [])
    if run is not None and run.get("status") not in (None, "ok"):
        warnings.append(runfolder.run_status_line(run))
    warnings.extend(foreign.coverage_warnings(infos, events, run))
    if events.height == 0:
        raise TracekitError("the traces hold no timed events", path)

    rank_ids = [i.rank for i in infos]
    nodes, topo_source, topo_warn = node_of_ranks(
        rank_ids,
        run,
        ranks_per_node,
        {i.rank: i.host_name for i in infos},
        layout=nccl_layout(path) if path.is_dir() else None,
    )
    warnings.extend(topo_warn)
    gpu_ranks = {i.rank for i in infos if i.has_gpu}
    group_sizes = {i.rank: int(i.world_size) for i in infos if i.world_size}
    # process groups (flight recorder, run.json, pg_config) and clock offsets between hosts
    from tracekit import clock
    from tracekit.analyses import groups

    group_sources = groups.load_sources(path, run, infos)
    warnings.extend(group_sources.warnings)
    raw_coll = collectives.raw_collectives(events, group_sizes, group_sources)
    events, group_sources, clock_summary, clock_warn = clock.align(
        events, infos, group_sources, raw_coll[0], align_clocks
    )
    if clock_summary and clock_summary.get("applied"):  # times moved: match again
        raw_coll = collectives.raw_collectives(events, group_sizes, group_sources)
    warnings.extend(clock_warn)

    windows = timeline.analysis_windows(events, gpu_ranks)
    warnings.extend(timeline.marker_warnings(events))
    iv = timeline.intervals(events, windows, gpu_ranks, raw_coll[0])
    windows = timeline.refine_gpu_windows(windows, iv, gpu_ranks)
    empty = windows.filter(pl.col("start_ns").is_null() | pl.col("end_ns").is_null())[
        "rank"
    ].to_list()
    if len(empty) == windows.height:
        raise TracekitError(
            "the traces hold no compute or communication events: nothing to analyse", path
        )
    if empty:  # a rank with only metadata/annotations: say so and leave it out
        warnings.append(
            f"ranks {empty}: no compute or communication events in the window; left out"
        )
        keep = ~pl.col("rank").is_in(empty)
        windows, iv, events = windows.filter(keep), iv.filter(keep), events.filter(keep)
        raw_coll = collectives.raw_collectives(
            events, group_sizes, group_sources
        )  # matched without the ranks left out
        infos = [i for i in infos if i.rank not in empty]
        rank_ids = [i.rank for i in infos]
        nodes = {r: n for r, n in nodes.items() if r not in empty}
    seg = timeline.segments(iv, windows)
    markers = timeline.step_markers(events)
    rank_table = breakdown.rank_breakdown(seg, windows, markers, nodes)
    coll, coll_warn = collectives.collectives_table(raw_coll, windows)
    warnings = groups.drop_resolved_warnings(warnings, coll) + coll_warn

    inputs = Inputs(path, run, infos, events, windows, seg, markers, coll, nodes)
    sections: dict[str, Any] = {"pipeline": None, "overlap": None, "traffic": None}
    frames: dict[str, pl.DataFrame] = {}
    for key, build in _sections().items():
        value, extra, section_warnings = build(inputs)
        sections[key] = value
        frames.update(extra)
        warnings.extend(section_warnings)

    kinds = windows["kind"].unique().to_list()
    summary: dict[str, Any] = {
        "schema_version": runfolder.SUMMARY_SCHEMA_VERSION,
        "source": str(path),
        "warnings": warnings,
        "window": {
            "kind": "complete_steps" if kinds == ["complete_steps"] else "whole_trace",
            "steps": int(windows["steps"].min() or 0),
            "start_ns": int(windows["start_ns"].min()),
            "end_ns": int(windows["end_ns"].max()),
            "per_rank": windows.drop("cutoff_ns").to_dicts(),
        },
        "topology": {"source": topo_source, "nodes": {str(r): n for r, n in nodes.items()}},
        "clock": clock_summary,
        "sampling": selection.summary(),
        "run": None
        if run is None
        else {
            k: run.get(k)
            for k in ("strategy", "world_size", "backend", "device", "precision", "status")
        },
        "ranks": [{k: _finite(v) for k, v in row.items()} for row in rank_table.to_dicts()],
        "collectives": collectives.collectives_summary(coll),
        **sections,
    }
    steps = summary["window"]["steps"]
    summary["collectives"]["ideal_bytes_per_rank_per_step"] = (
        summary["collectives"]["ideal_bytes_per_rank"] / steps
        if steps and summary["collectives"]["ideal_bytes_per_rank"] is not None
        else None
    )
    return Analysis(
        path=path,
        summary=summary,
        events=events,
        ranks=rank_table,
        timeline=timeline.merge_states(seg),
        collectives=coll,
        infos=infos,
        run=run,
        frames=frames,
    )


def default_out_dir(path: Path) -> Path:
    """PATH/analysis for folders, FILE.analysis/ for a single trace file."""
    path = Path(path)
    return (
        runfolder.analysis_dir(path)
        if runfolder.is_folder(path)
        else path.with_name(path.name + ".analysis")
    )


def _writable_dir(folder: Path) -> bool:
    """Writable, and not marked read-only: root may bypass the bits, but a folder without any
    write bit is one its owner meant to keep as it is (shared trace archives)."""
    existing = Path(folder)
    while not existing.exists():
        existing = existing.parent
    try:
        mode = existing.stat().st_mode
    except OSError:
        return False
    return os.access(existing, os.W_OK) and bool(mode & 0o222)


#: written into every analysis folder, listing what the analysis wrote: only a folder whose
#: files are all listed there is ever replaced by another analysis
MARKER = ".tracekit-analysis"


def _refuse(out: Path, problem: str) -> TracekitError:
    return TracekitError(f"{problem}; choose another place with --out", out)


def is_analysis(folder: Path) -> bool:
    """FOLDER holds an analysis and nothing else: every entry is listed in its marker; or (an
    analysis written before the marker existed) summary.json and *.parquet files only, with
    perhaps the old ``cache/`` of *.events.parquet entries."""
    folder = Path(folder)
    try:
        names = set(os.listdir(folder))
    except OSError:
        return False
    if MARKER in names:
        try:
            listed = set(json.loads((folder / MARKER).read_text())["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return names - {MARKER} <= listed and all(
            (folder / n).is_file() and not (folder / n).is_symlink() for n in names
        )
    if "summary.json" not in names:
        return False
    for name in names:
        entry = folder / name
        if entry.is_symlink():
            return False
        if name == "summary.json" or (name.endswith(".parquet") and entry.is_file()):
            continue
        if name == "cache" and entry.is_dir():
            inner = os.listdir(entry)
            if all(n.endswith(".events.parquet") or n.endswith(".tmp") for n in inner):
                continue
        return False
    return True


def check_out(out: Path, source: Path | None = None) -> None:
    """Refuse (TracekitError) an --out that an analysis must not replace: a symbolic link, the
    input or a folder holding it, the current folder or one holding it, a file, or a folder
    that is neither empty nor an analysis (tracekit.analyze.is_analysis)."""
    out = Path(out)
    if out.is_symlink():
        raise _refuse(out, "is a symbolic link: an analysis never replaces it")
    where = out.resolve()
    if source is not None:
        src = Path(source).resolve()
        if where == src:
            raise _refuse(out, "is the input: an analysis replaces its whole folder")
        if src.is_relative_to(where):
            raise _refuse(out, f"holds the input ({source}): an analysis replaces its whole folder")
    if Path.cwd().resolve().is_relative_to(where):
        raise _refuse(out, "is the current folder or holds it: an analysis replaces its folder")
    if out.exists() and not out.is_dir():
        raise _refuse(out, "exists and is not a folder")
    if out.is_dir() and any(os.scandir(out)) and not is_analysis(out):
        raise _refuse(
            out,
            "is not an analysis folder (it holds other files, and an analysis replaces its "
            "whole folder)",
        )


def _write_failed(out: Path, exc: BaseException) -> TracekitError:
    return _refuse(out, f"cannot write the analysis here ({outputs.reason(exc)})")


def write_analysis(result: Analysis, out: Path) -> Path:
    """summary.json + <table>.parquet (+ the MARKER) into OUT, all or nothing; OUT is replaced
    only when it is empty or an earlier analysis (check_out)."""
    out = Path(out)
    check_out(out, result.path)
    if not _writable_dir(out.parent):
        raise _refuse(out, "cannot write the analysis here (read-only folder)")
    tmp = outputs.temp_name(out, folder=True)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        outputs.sweep(out.parent)  # temp folders of analyses killed before they finished
        tmp.mkdir()  # mode 0777 less the umask: an ordinary folder
    except OSError as exc:
        raise _write_failed(out, exc) from None
    try:
        (tmp / "summary.json").write_text(encode(result.typed_summary))
        files = ["summary.json"]
        for name, frame in result.tables().items():
            # zstd level 1 without statistics: the events table is most of the writing time
            # (0.47 -> 0.38 CPU-s for 650k rows), for files 10 % larger
            frame.write_parquet(tmp / f"{name}.parquet", compression_level=1, statistics=False)
            files.append(f"{name}.parquet")
        (tmp / MARKER).write_text(json.dumps({"producer": "tracekit", "files": files}) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if outputs.is_write_failure(exc):
            raise _write_failed(out, exc) from None
        raise
    return out
