"""Writing a report: the analyses given, the format's writer, OUT written atomically.

Every format is written to a temporary name beside OUT (tracekit.outputs) and renamed, so
nothing half-written is ever left; a failure removes the temporary file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracekit import outputs, run_inputs
from tracekit.errors import TracekitError
from tracekit.report.data import write_csv, write_json, write_parquet, write_perfetto
from tracekit.report.markdown import write_md
from tracekit.report.page import write_html
from tracekit.report.progress import Progress
from tracekit.report.static import write_pdf, write_png
from tracekit.runname import display_names

#: a format's writer: (analyses, their names, the temporary file to fill, progress)
Writer = Callable[[Sequence[Any], Sequence[str], Path, Progress | None], None]

#: each format: its name, its file extension, its writer
_TABLE: tuple[tuple[str, str, Writer], ...] = (
    ("html", "html", write_html),
    ("pdf", "pdf", write_pdf),
    ("png", "png", write_png),
    ("md", "md", write_md),
    ("json", "json", write_json),
    ("csv", "csv", write_csv),
    ("parquet", "parquet", write_parquet),
    ("perfetto", "perfetto.json", write_perfetto),
)
FORMATS: dict[str, str] = {fmt: ext for fmt, ext, _ in _TABLE}
WRITERS: dict[str, Writer] = {fmt: writer for fmt, _, writer in _TABLE}


def default_output(fmt: str) -> Path:
    """``report.<ext>`` in the current folder."""
    return Path(f"report.{FORMATS[fmt]}")


def _cannot_write(out: Path, why: str | None) -> TracekitError:
    return TracekitError(f"cannot write the report here ({why}); choose another place with -o", out)


def refuse_inputs(out: Path, paths: Sequence[Path]) -> None:
    """Refuse a report OUT that is or is inside what the report reads of PATHS (a trace,
    run.json, traces/, memory/, ..., the analysis folder: its prediction.json)."""
    inputs = [i for p in paths for i in run_inputs.inputs_of(p, analysis=True)]
    run_inputs.refuse_input_overlap(out, inputs, "-o", sources=list(paths))


def _atomic_target(out: Path, suffix: str = "") -> Path:
    """A new empty temporary file beside OUT (tracekit.outputs: our pid in its name); OUT must be
    a regular file or nothing (a FIFO, symlink, device or folder is refused)."""
    out = Path(out)
    outputs.check_file_target(out, "-o")
    parent = out.parent
    tmp = outputs.temp_name(out, suffix=suffix)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        outputs.sweep(parent)  # temp files of reports killed before they finished
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise _cannot_write(out, exc.strerror) from None
    return tmp


def _commit(tmp: Path, out: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # private while written; a report is an ordinary file
    outputs.check_file_target(out, "-o")  # again: it may have appeared while we wrote
    os.replace(tmp, out)


def format_of(out: str | Path) -> str:
    """The format a file name asks for: ``.pdf`` -> pdf, ``.perfetto.json`` -> perfetto,
    ``.markdown`` -> md; html for any other name."""
    name = Path(out).name.lower()
    if name.endswith(".perfetto.json") or name.endswith(".trace.json"):
        return "perfetto"
    suffix = Path(name).suffix.lstrip(".")
    suffix = {"htm": "html", "markdown": "md"}.get(suffix, suffix)
    return suffix if suffix in FORMATS else "html"


def write_report(
    analyses: Sequence[Any],
    out: str | Path,
    fmt: str | None = None,
    *,
    names: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write the report of ANALYSES (tracekit.analysis.Analysis: several make a comparison) in
    FMT (default: from OUT's name, :func:`format_of`) to OUT; ``names``: how each run is shown
    (default tracekit.runname's display names of their paths)."""
    fmt = fmt or format_of(out)
    if fmt not in FORMATS:
        raise TracekitError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    analyses = list(analyses)
    if not analyses:
        raise TracekitError("nothing to report: give at least one run folder or trace")
    names = list(names) if names else display_names([Path(a.path) for a in analyses])
    out = Path(out)
    refuse_inputs(out, [Path(a.path) for a in analyses])
    tmp = _atomic_target(out)
    try:
        if progress:
            progress(f"writing {fmt} report")
        WRITERS[fmt](analyses, names, tmp, progress)
        _commit(tmp, out)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if outputs.is_write_failure(exc):
            raise _cannot_write(out, outputs.reason(exc)) from None
        raise
    return out
