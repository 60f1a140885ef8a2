"""JSON files in a trace folder that are not Kineto traces: found, named, and left out.

Folders people bring hold more than Kineto traces: PyTorch execution traces (``*_et.json``,
``{"schema": ..., "nodes": [...]}``), memory snapshots and timelines, configs, results. A
Kineto trace is a JSON object with a ``traceEvents`` member; anything else is not one.

Deciding costs one 64 KB head per file for real traces (Kineto writes ``"traceEvents":`` after
a few KB of metadata); a file whose head does not show it is checked in full by a validating
pass that builds no objects (msgspec with ``traceEvents`` kept raw). A file that is not valid
JSON, or cannot be read, is *not* declared foreign: the trace reader then reports it as the
bad input it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import msgspec

from tracekit.errors import TracekitError
from tracekit.ingest.foreign import names
from tracekit.ingest.kineto_files import read_bytes, read_head

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:')


class _Probe(msgspec.Struct):
    traceEvents: msgspec.Raw | None = None  # noqa: N815 - the file's key


def is_kineto(path: Path) -> bool:
    """False only for a readable, valid JSON file that is not an object with traceEvents."""
    head = read_head(path)
    if head is None or _EVENTS_KEY.search(head):
        return True
    if head.lstrip()[:1] == b"[":  # a top-level array: never a Kineto trace
        return False
    try:
        probe = msgspec.json.decode(read_bytes(Path(path)), type=_Probe)
    except msgspec.ValidationError:  # valid JSON, not an object
        return False
    except (msgspec.DecodeError, TracekitError, RecursionError):
        return True  # broken: the reader says what is wrong with it
    return probe.traceEvents is not None


def split(files: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """(Kineto traces, other JSON files). When no file is a Kineto trace, all are returned as
    traces: reading them gives the one-line error it always gave."""
    kept: list[Path] = []
    skipped: list[Path] = []
    for f in files:
        (kept if is_kineto(f) else skipped).append(f)
    return (kept, skipped) if kept else (list(files), [])


def skipped_warning(skipped: Sequence[Path]) -> str:
    word = "file that is" if len(skipped) == 1 else "files that are"
    return (
        f"skipped {len(skipped)} JSON {word} not a Kineto trace (no traceEvents: "
        f"execution traces, memory snapshots, configs): {names(skipped, most=10)}"
    )
