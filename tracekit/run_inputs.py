"""What a command reads, and the one check that no output lands on or inside it (#24 item 2).

Every writer (report/compare ``-o``, ``analyze --out`` and ``--cache-dir``, ``predict --out``)
calls :func:`refuse_input_overlap` with :func:`inputs_of` the paths it reads, before any work:
an output that is, or is inside, an input is one line and exit 2 (docs/run-folder.md "Outputs
and the run folder's inputs").
"""

from __future__ import annotations

import os
from pathlib import Path

from tracekit import outputs, runfolder
from tracekit.errors import TracekitError

#: what a command reads of a run folder (docs/run-folder.md): an output is never any of these,
#: nor inside one (tracekit.ingest.load is their only reader)
RUN_INPUTS = ("run.json", "traces", "memory", "nccl", "train", "logs", "contention")
#: the same side folders of a foreign folder of traces (runfolder.find_trace_files skips them)
# a run's records beside its traces (one list: tracekit.outputs, which refuses outputs there)
_SIDE_FOLDERS = tuple(f for f in outputs.RECORD_FOLDERS if f != "traces")


def inputs_of(path: Path, analysis: bool = False, traces_folder: bool = True) -> list[Path]:
    """What a command that reads PATH reads: a run folder's run.json, traces/, memory/, nccl/,
    train/, logs/, contention/; a foreign folder's trace files and side folders; a trace file
    and the flight-recorder dumps beside it. ``analysis``: the command also reads the analysis
    folder (report, compare: its prediction.json). ``traces_folder=False``: a run folder's
    trace files one by one instead of its traces/ (a cache folder may be traces/: entries
    beside the traces are the cache's own place, tracekit.ingest.cache)."""
    path = Path(path)
    found: list[Path] = [path]
    try:
        if path.is_dir() and runfolder.is_run_folder(path):
            found = [path / name for name in RUN_INPUTS if traces_folder or name != "traces"]
            if not traces_folder:
                found += runfolder.find_trace_files(path)
        elif path.is_dir():
            found = [path / name for name in _SIDE_FOLDERS]  # a folder of traces is no input:
            found += runfolder.find_trace_files(path)  # the traces it holds are
        found += runfolder.flight_recorder_dumps(path)
        if analysis:
            found.append(runfolder.analysis_out_dir(path))
    except (TracekitError, OSError):
        pass  # unreadable or gone: the command says so; what could be named is named
    return found


def _real(path: Path) -> Path:
    """PATH with every link resolved, also when PATH (or a parent of it) does not exist yet."""
    return Path(os.path.realpath(path))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_input_overlap(
    out: Path, inputs: list[Path], option: str, sources: list[Path] | None = None
) -> None:
    """Refuse (TracekitError, one line) an output OUT that is, or is inside, one of INPUTS
    (:func:`inputs_of`), compared after resolving links (also of a parent that exists when OUT
    does not) and as the same file (a hard link). SOURCES, the folders the command read: OUT
    must not be inside one where the next read of it would take OUT for a trace (a file named
    ``*.json``/``*.json.gz`` in a foreign folder of traces)."""
    where = _real(out)
    for given in inputs:
        real = _real(given)
        inside = where != real and where.is_relative_to(real)
        if where == real or inside or _same_file(out, given):
            what = "inside an input" if inside else "an input"
            raise TracekitError(
                f"is {what} of this command ({given}): tracekit never writes over what it "
                f"reads; choose another place with {option}",
                out,
            )
    for source in sources or []:
        real = _real(source)
        if not real.is_dir() or not where.is_relative_to(real) or where == real:
            continue
        rel = where.relative_to(real).parts
        if (
            runfolder.is_run_folder(real)
            or not where.name.endswith(runfolder.TRACE_SUFFIXES)
            or any(p.startswith(".") or p in _SIDE_FOLDERS or p == "analysis" for p in rel)
            or any(p.endswith(".analysis") for p in rel[:-1])
            or where.name in ("run.json", "summary.json")
        ):
            continue
        raise TracekitError(
            f"is inside {source}, a folder of traces this command reads: the next analysis of "
            f"it would take this file for a trace; choose another place with {option}",
            out,
        )
