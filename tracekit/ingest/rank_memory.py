"""When a rank is read in parts (tracekit.ingest.kineto_stream): ``$TRACEKIT_RANK_MEMORY``.

Polars-free: the CLI's read-ahead (tracekit.ingest.kineto_files.prefetch) asks it before it
imports polars, and leaves the ranks that will be streamed alone (reading one ahead would hold
its whole JSON).
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

from tracekit import guarded_read
from tracekit.errors import TracekitError

MEMORY_ENV = "TRACEKIT_RANK_MEMORY"
DEFAULT_RANK_MEMORY = 256 * 2**20
_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def rank_memory() -> int:
    """``$TRACEKIT_RANK_MEMORY``: the JSON bytes above which a rank is streamed."""
    text = os.environ.get(MEMORY_ENV, "").strip().lower().removesuffix("b").removesuffix("i")
    if not text:
        return DEFAULT_RANK_MEMORY
    unit = text[-1] if text[-1] in _SUFFIXES and text[-1] else ""
    try:
        value = int(float(text.removesuffix(unit)) * _SUFFIXES[unit])
        if value < 0:
            raise ValueError(text)
    except (ValueError, OverflowError):
        raise TracekitError(
            f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r} is not a number of bytes (e.g. 256M)"
        ) from None
    return value


def block_bytes(setting: int) -> int:
    """How much JSON is read (and scanned) at a time: a quarter of the setting, 1 to 64 MiB."""
    return max(2**20, min(64 * 2**20, setting // 4))


def json_size(path: Path) -> int:
    """The trace's JSON size, or an estimate: plain files their size; gzip the size its trailer
    states when deflate could give it from this file and trace JSON would (4x to 1032x: the
    field is the size mod 4 GiB), else 20x the file (trace JSON gzips 10-20x)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return 0  # a FIFO must not block us: the held read refuses it
        with os.fdopen(guarded_read.open_regular(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            stated = int.from_bytes(f.read(4), "little")
    except (OSError, TracekitError):
        return 0  # the held read says what is wrong with it
    return stated if 4 * size <= stated <= 1032 * size else 20 * size


def should_stream(path: Path, setting: int | None = None) -> bool:
    """True when PATH's JSON is over the setting (and the C scanner is built)."""
    limit = rank_memory() if setting is None else setting
    return _scanner_built() and json_size(path) > limit


@functools.lru_cache(maxsize=1)
def _scanner_built() -> bool:
    try:
        from tracekit.ingest import _kscan  # noqa: F401
    except ImportError:
        return False
    return True
