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
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tracekit import outputs, runfolder
from tracekit.errors import TracekitError
from tracekit.ingest import guarded_read
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
    path = Path(path)
    return (
        runfolder.analysis_dir(path)
        if runfolder.is_folder(path)
        else path.with_name(path.name + ".analysis")
    )


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
            listed = set(guarded_read.load_json(folder / MARKER)["files"])
        except (TracekitError, KeyError, TypeError):
            return False
        return _all_listed(folder, names - {MARKER}, listed) and (folder / MARKER).is_file()
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
