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
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl

from tracekit import runfolder, theory, timeline
from tracekit.analyses import breakdown, collectives
from tracekit.errors import TracekitError
from tracekit.ingest.kineto import TraceInfo, read_traces
from tracekit.topology import node_of_ranks


@dataclass(frozen=True)
class Inputs:
    """What every analysis section gets: the frames of the steps before it, read-only."""

    path: Path
    run: dict[str, Any] | None
    infos: list[TraceInfo]
    events: pl.DataFrame
    windows: pl.DataFrame        # rank, kind, steps, start_ns, end_ns, cutoff_ns
    segments: pl.DataFrame       # elementary timeline segments with state (timeline.segments)
    markers: pl.DataFrame        # ProfilerStep markers: rank, step, start_ns, end_ns
    collectives: pl.DataFrame    # one row per collective call per rank
    nodes: dict[int, int]        # rank -> node


# A section: Inputs -> (summary value or None, extra frames, warnings). Each analysis module
# contributes one entry; the summary key is the DESIGN.md name.
Section = Callable[[Inputs], "tuple[Any, dict[str, pl.DataFrame], list[str]]"]


def _sections() -> dict[str, Section]:
    """summary key -> section builder (imported lazily so one broken analysis names itself)."""
    return {}


@dataclass
class Analysis:
    """Everything `tracekit analyze` computes: the summary dict and the frames behind it."""

    path: Path
    summary: dict[str, Any]
    events: pl.DataFrame
    ranks: pl.DataFrame          # one row per rank: the breakdown
    timeline: pl.DataFrame       # merged state segments: rank, start_ns, end_ns, state
    collectives: pl.DataFrame    # one row per collective call per rank
    infos: list[TraceInfo] = field(default_factory=list)
    run: dict[str, Any] | None = None
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)   # from the sections: pipeline_ops, ...

    def tables(self) -> dict[str, pl.DataFrame]:
        return {"ranks": self.ranks, "timeline": self.timeline, "collectives": self.collectives,
                "events": self.events, **self.frames}


def _select_ranks(files: list[Path], ranks: Sequence[int] | None) -> list[Path]:
    if not ranks:
        return files
    wanted = set(ranks)
    chosen = [f for f in files if runfolder.rank_from_filename(f.name) in wanted]
    return chosen


def _memory_section(path: Path, run: dict | None, ranks: list[int]) -> dict[str, Any] | None:
    if run is None:
        return None
    per_rank = []
    for r in ranks:
        m = runfolder.load_json_if_present(runfolder.memory_path(path, r))
        if isinstance(m, dict):
            per_rank.append({"rank": r, **{k: m.get(k) for k in (
                "params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes",
                "activation_peak_bytes", "peak_bytes")}})
    if not per_rank:
        return None
    cfg = run.get("config") or {}
    psi = int(cfg.get("params") or cfg.get("param_count") or 0)
    dp_degree = int(cfg.get("dp_degree") or run.get("world_size") or 1)
    return {
        "per_rank": per_rank,
        "theory": theory.model_states_bytes(str(run.get("strategy")), str(run.get("precision", "fp32")), psi, dp_degree),
    }


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def analyze(
    path: str | Path,
    ranks_per_node: int | None = None,
    ranks: Sequence[int] | None = None,
    workers: int | None = None,
) -> Analysis:
    """Analyse a run folder, a folder of Kineto traces, or one trace file."""
    path = Path(path)
    run = runfolder.load_run_json(path) if path.is_dir() else None
    files = _select_ranks(runfolder.find_trace_files(path), ranks)
    if not files:
        raise TracekitError("no Kineto trace files (*.json, *.json.gz) found", path)
    infos, events = read_traces(files, workers=workers)
    warnings: list[str] = []
    for info in infos:
        warnings.extend(f"{info.path.name}: {w}" for w in info.warnings)
    if run is not None:
        missing = sorted(set(range(int(run.get("world_size") or 0))) - {i.rank for i in infos})
        if missing and not ranks:
            warnings.append(f"ranks {missing} of {run.get('world_size')} have no trace")
        if run.get("status") not in (None, "ok"):
            warnings.append(f"the run's status is {run.get('status')!r}: {run.get('errors')}")
    if events.height == 0:
        raise TracekitError("the traces hold no timed events", path)

    rank_ids = [i.rank for i in infos]
    nodes, topo_source, topo_warn = node_of_ranks(
        rank_ids, run, ranks_per_node, {i.rank: i.host_name for i in infos}
    )
    warnings.extend(topo_warn)
    gpu_ranks = {i.rank for i in infos if i.has_gpu}
    group_sizes = {i.rank: int(i.world_size) for i in infos if i.world_size}

    windows = timeline.analysis_windows(events, gpu_ranks)
    iv = timeline.intervals(events, windows, gpu_ranks)
    windows = timeline.refine_gpu_windows(windows, iv, gpu_ranks)
    seg = timeline.segments(iv, windows)
    markers = timeline.step_markers(events)
    rank_table = breakdown.rank_breakdown(seg, windows, markers, nodes)
    coll, coll_warn = collectives.collectives_table(events, windows, group_sizes)
    warnings.extend(coll_warn)

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
        "run": None if run is None else {k: run.get(k) for k in ("strategy", "world_size", "backend", "device", "precision", "status")},
        "ranks": [{k: _finite(v) for k, v in row.items()} for row in rank_table.to_dicts()],
        "collectives": collectives.collectives_summary(coll),
        "memory": _memory_section(path, run, rank_ids) if path.is_dir() else None,
        **sections,
    }
    steps = summary["window"]["steps"]
    summary["collectives"]["ideal_bytes_per_rank_per_step"] = (
        summary["collectives"]["ideal_bytes_per_rank"] / steps if steps else None)
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
    return runfolder.analysis_dir(path) if path.is_dir() else path.with_name(path.name + ".analysis")


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


def write_analysis(result: Analysis, out: Path) -> Path:
    """summary.json + <table>.parquet into OUT, all or nothing."""
    out = Path(out)
    if not _writable_dir(out.parent):
        raise TracekitError("cannot write the analysis here (read-only folder); choose another place with --out", out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise TracekitError(f"cannot write the analysis here ({exc.strerror}); choose another place with --out", out) from None
    try:
        (tmp / "summary.json").write_text(json.dumps(result.summary, indent=2, default=str) + "\n")
        for name, frame in result.tables().items():
            frame.write_parquet(tmp / f"{name}.parquet")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TracekitError(f"cannot write the analysis ({exc.strerror}); choose another place with --out", out) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
