"""Where a trace's cache entry lives (tracekit.ingest.cache): names only, no polars.

Apart from the cache itself, `tracekit analyze` reads these before polars is loaded, to know
which traces it will parse (tracekit.ingest.read_ahead).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SUFFIX = ".events.parquet"
CACHE_DIR_ENV = "TRACEKIT_CACHE_DIR"


def default_dir() -> Path:
    """$TRACEKIT_CACHE_DIR, else $XDG_CACHE_HOME/tracekit, else ~/.cache/tracekit."""
    given = os.environ.get(CACHE_DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "tracekit"


def folder(cache_dir: Path | None) -> Path:
    """The cache folder to use: CACHE_DIR when given, else :func:`default_dir`."""
    return Path(cache_dir) if cache_dir is not None else default_dir()


def _stem(trace: Path) -> str:
    name = Path(trace).name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def resolved(trace: Path) -> str:
    """The trace's resolved path, as an entry records it."""
    return str(Path(trace).resolve())


def beside(trace: Path) -> Path:
    """``rank0.json.gz`` -> ``rank0.events.parquet`` in the trace's own folder."""
    trace = Path(trace)
    return trace.with_name(_stem(trace) + SUFFIX)


def in_dir(trace: Path, cache_dir: Path | None = None) -> Path:
    """The entry for ``trace`` in a cache folder: its name + a hash of its resolved path."""
    # fsencode: a name that is not UTF-8 hashes its own bytes (the same hash for every other)
    h = hashlib.sha256(os.fsencode(resolved(trace))).hexdigest()[:16]
    return folder(cache_dir) / f"{_stem(trace)}-{h}{SUFFIX}"


def candidates(trace: Path, cache_dir: Path | None) -> list[Path]:
    return [beside(trace), in_dir(trace, cache_dir)]
