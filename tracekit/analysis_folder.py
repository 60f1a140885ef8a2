"""The analysis folder: where `tracekit analyze` writes, and how, all or nothing.

``write_analysis(result, out)`` writes summary.json, one parquet file per table, and the
per-rank tables (``events/``, ``timeline/``: one ``rank<R>.parquet`` each, written one rank at
a time, so writing never holds every rank's events) into a temporary folder beside ``out`` and
renames it into place, so a reader never sees a half-written analysis; it replaces only an
empty folder or an earlier analysis (``check_out``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tracekit import guarded_read, outputs, run_inputs, runfolder
from tracekit.errors import TracekitError
from tracekit.summary import Summary, encode

if TYPE_CHECKING:  # `tracekit analyze` imports this module before polars: it starts reading first
    import polars as pl


class Written(Protocol):
    """What is written of an analysis (tracekit.analysis.Analysis)."""

    @property
    def path(self) -> Path: ...
    @property
    def summary(self) -> Summary: ...
    def tables(self) -> dict[str, pl.DataFrame]: ...
    def rank_tables(self) -> dict[str, dict[int, pl.LazyFrame]]: ...


def default_out_dir(path: Path) -> Path:
    """PATH/analysis for folders, FILE.analysis/ for a single trace file."""
    return runfolder.analysis_out_dir(path)


#: written into every analysis folder, listing what the analysis wrote: only a folder whose
#: files are all listed there is ever replaced by another analysis
MARKER = ".tracekit-analysis"


def _refuse(out: Path, problem: str) -> TracekitError:
    return TracekitError(f"{problem}; choose another place with --out", out)


def _all_listed(folder: Path, names: set[str], listed: set[str]) -> bool:
    """Every entry of FOLDER is a regular file listed in the marker, or a folder (a per-rank
    table) of regular files that are all listed as ``<folder>/<file>``."""
    for name in names:
        entry = folder / name
        if entry.is_symlink():
            return False
        if entry.is_file() and name in listed:
            continue
        if not entry.is_dir() or not any(f.startswith(f"{name}/") for f in listed):
            return False
        try:
            inner = os.listdir(entry)
        except OSError:
            return False
        if not all(
            f"{name}/{n}" in listed and (entry / n).is_file() and not (entry / n).is_symlink()
            for n in inner
        ):
            return False
    return True


#: every file an analysis writes, in one place beside its writer (:func:`write_analysis`):
#: summary.json, one ``<table>.parquet`` per frame of tracekit.analyses.manifest (and the
#: ``events``/``timeline`` tables of before the per-rank folders), ``events/`` and
#: ``timeline/`` of ``rank<R>.parquet``, predict's prediction.json, and an old ``cache/`` of
#: ``*.events.parquet``. A folder from before the marker is an analysis only when it holds these
#: alone (tests/test_outputs_vs_inputs.py checks the tables against the manifest).
ANALYSIS_FILES = frozenset({"summary.json", "prediction.json"})
ANALYSIS_TABLES = frozenset(
    {
        "bubbles",
        "collective_matches",
        "collectives",
        "critical_path",
        "events",
        "overlap_units",
        "pipeline_ops",
        "pipeline_replay",
        "rank_states",
        "ranks",
        "root_causes",
        "steps",
        "timeline",
        "traffic_links",
        "wait_matrix",
        "wait_states",
    }
)
RANK_TABLES = frozenset({"events", "timeline"})
_RANK_FILE = re.compile(r"rank\d{1,10}\.parquet")


def _written_by_an_analysis(entry: os.DirEntry[str]) -> bool:
    """ENTRY (of a folder without the marker) is one an analysis writes (ANALYSIS_FILES...)."""
    name = entry.name
    if entry.is_symlink():
        return False
    if entry.is_file():
        table = name.removesuffix(".parquet")
        return name in ANALYSIS_FILES or (name != table and table in ANALYSIS_TABLES)
    if not entry.is_dir() or name not in RANK_TABLES | {"cache"}:
        return False
    try:
        inner = list(os.scandir(entry.path))
    except OSError:
        return False
    pattern = _RANK_FILE if name in RANK_TABLES else re.compile(r"[^/]+\.events\.parquet")
    return all(
        e.is_file() and not e.is_symlink() and pattern.fullmatch(e.name) is not None for e in inner
    )


def is_analysis(folder: Path) -> bool:
    """FOLDER holds an analysis and nothing else: every entry is listed in its marker; or (an
    analysis written before the marker existed) summary.json and files an analysis writes
    only (ANALYSIS_FILES): the user's own mydata.parquet beside them makes it not one."""
    folder = Path(folder)
    try:
        names = set(os.listdir(folder))
    except OSError:
        return False
    if MARKER in names:
        try:
            listed = set(guarded_read.load_json(folder / MARKER)["files"])
        except (TracekitError, KeyError, TypeError):
            return False
        return _all_listed(folder, names - {MARKER}, listed) and (folder / MARKER).is_file()
    if "summary.json" not in names:
        return False
    try:
        return all(_written_by_an_analysis(e) for e in os.scandir(folder))
    except OSError:
        return False


def check_out(out: Path, source: Path | None = None) -> None:
    """Refuse (TracekitError) an --out that an analysis must not replace: a symbolic link, the
    input or a folder holding it, the current folder or one holding it, a file, or a folder
    that is neither empty nor an analysis (:func:`is_analysis`)."""
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
        run_inputs.refuse_input_overlap(out, run_inputs.inputs_of(source), "--out")
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


def write_analysis(result: Written, out: Path) -> Path:
    """summary.json + <table>.parquet (+ the MARKER) into OUT, all or nothing; OUT is replaced
    only when it is empty or an earlier analysis (check_out)."""
    out = Path(out)
    check_out(out, result.path)
    if not outputs.writable(out.parent):
        raise _refuse(out, "cannot write the analysis here (read-only folder)")
    tmp = outputs.temp_name(out, folder=True)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        outputs.sweep(out.parent)  # temp folders of analyses killed before they finished
        outputs.make_owned_folder(tmp)  # mode 0777 less the umask: an ordinary folder
    except OSError as exc:
        raise _write_failed(out, exc) from None
    try:
        (tmp / "summary.json").write_text(encode(result.summary))
        files = ["summary.json"]
        # zstd level 1 without statistics: the events table is most of the writing time
        # (0.47 -> 0.38 CPU-s for 650k rows), for files 10 % larger
        for name, frame in result.tables().items():
            frame.write_parquet(tmp / f"{name}.parquet", compression_level=1, statistics=False)
            files.append(f"{name}.parquet")
        for name, per_rank in result.rank_tables().items():
            (tmp / name).mkdir()
            for rank, plan in per_rank.items():  # one rank in memory at a time
                files.append(f"{name}/rank{rank}.parquet")
                plan.collect().write_parquet(tmp / files[-1], compression_level=1, statistics=False)
        (tmp / MARKER).write_text(json.dumps({"producer": "tracekit", "files": files}) + "\n")
        outputs.release(tmp)
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


def _make_folders(folder: Path) -> list[Path]:
    """Make FOLDER and its missing parents; the ones made, outermost first (removed again,
    when still empty, if the write fails: nothing half-written is left)."""
    missing = []
    here = folder
    while not here.exists() and here.parent != here:
        missing.append(here)
        here = here.parent
    made = []
    for path in reversed(missing):
        path.mkdir()
        made.append(path)
    return made


def _listed_files(folder: Path) -> list[str]:
    """What the marker of analysis folder FOLDER lists; for one from before the marker, its
    files as the marker would list them (``cache/<entry>`` for its old cache)."""
    if (folder / MARKER).exists():
        return list(guarded_read.load_json(folder / MARKER)["files"])
    return sorted(
        f"{p.parent.name}/{p.name}" if p.parent != folder else p.name
        for p in folder.rglob("*")
        if p.is_file()
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = outputs.temp_name(path)
    try:
        with open(tmp, "x") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def add_file(folder: Path, name: str, text: str, option: str = "--out") -> Path:
    """Write NAME (TEXT) into FOLDER atomically. When FOLDER is an analysis folder, or new or
    empty, NAME is listed in its marker first (written atomically too), so that the next
    analysis still recognises the folder as one it may replace (`tracekit predict` writes
    prediction.json this way); another folder only gets the file. On a failed write nothing
    is left: the temporary file and the folders made are removed, and the error is one line."""
    folder = Path(folder)
    target = folder / name
    made: list[Path] = []
    try:
        made = _make_folders(folder)
        ours = made or not any(os.scandir(folder)) or is_analysis(folder)
        if ours:
            files = [f for f in _listed_files(folder) if f != name] + [name]
            _write_atomic(
                folder / MARKER, json.dumps({"producer": "tracekit", "files": files}) + "\n"
            )
        _write_atomic(target, text)
    except BaseException as exc:
        if made:  # the marker is ours (made in this process); the folders too, when empty
            (folder / MARKER).unlink(missing_ok=True)
        for path in reversed(made):
            try:
                path.rmdir()
            except OSError:
                break
        if outputs.is_write_failure(exc):
            raise TracekitError(
                f"cannot write here ({outputs.reason(exc)}); choose another place with {option}",
                target,
            ) from None
        raise
    return target
