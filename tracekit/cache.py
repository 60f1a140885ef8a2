"""The columnar cache: each trace file's events table as parquet, reused while the trace is unchanged.

Parsing JSON is most of what `tracekit analyze` costs; reading the same events back from
parquet costs a few percent of it. So ingest keeps, per trace file, one parquet file holding
its events frame (exactly EVENT_SCHEMA) with the file's TraceInfo and the cache key in the
parquet key-value metadata (one file: the table and what it describes can never disagree).

Where (first that exists with a matching key wins; new entries go to the first writable):

1. beside the trace: ``traces/rank0.json.gz`` -> ``traces/rank0.events.parquet``. This is also
   where a run's own ranks put it when they finish (ingest at source, tracekit.capture), so a
   thousand-rank job never funnels raw JSON through one machine;
2. ``<analysis dir>/cache/<name>-<path hash>.events.parquet`` when the trace's folder is
   read-only (a shared archive: never written to) or not writable.

Key: the trace's size and mtime (ns), the tracekit version, and a fingerprint of the ingest code
(the source of the modules that decide what a row holds), so an entry written by other code is
never read back. Any entry that does not match, cannot be read or lacks a column is ignored and
rewritten; a cache that cannot be written is skipped silently (it only saves time).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

SUFFIX = ".events.parquet"
FORMAT = 1  # bump when the layout of a cache entry changes
_META = "tracekit.cache"
_CODE = (
    "events.py",
    "runfolder.py",
    "cache.py",
    "ingest/kineto.py",
    "ingest/collectives.py",
    "ingest/devices.py",
    "ingest/_kscan.c",
)


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """tracekit version + cache format + a hash of the ingest code's source."""
    import tracekit

    root = Path(__file__).resolve().parent
    digest = hashlib.sha1(f"{tracekit.__version__}|{FORMAT}".encode())
    for name in _CODE:
        try:
            digest.update((root / name).read_bytes())
        except OSError:
            digest.update(name.encode())
    return f"{tracekit.__version__}+{digest.hexdigest()[:12]}"


def key(trace: Path) -> dict[str, Any] | None:
    """What identifies this version of the trace file (None when it cannot be stat'ed)."""
    try:
        st = Path(trace).stat()
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "code": fingerprint()}


def _stem(trace: Path) -> str:
    name = Path(trace).name
    for suffix in (".json.gz", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def beside(trace: Path) -> Path:
    """``rank0.json.gz`` -> ``rank0.events.parquet`` in the trace's own folder."""
    trace = Path(trace)
    return trace.with_name(_stem(trace) + SUFFIX)


def in_dir(trace: Path, cache_dir: Path) -> Path:
    """The entry for ``trace`` inside a cache folder (name + hash of the absolute path)."""
    h = hashlib.sha1(str(Path(trace).resolve()).encode()).hexdigest()[:10]
    return Path(cache_dir) / f"{_stem(trace)}-{h}{SUFFIX}"


def writable(folder: Path) -> bool:
    """Writable and not marked read-only (root bypasses the bits, but a folder without any
    write bit is one its owner meant to keep as it is: shared trace archives)."""
    existing = Path(folder)
    while not existing.exists():
        if existing.parent == existing:
            return False
        existing = existing.parent
    try:
        mode = existing.stat().st_mode
    except OSError:
        return False
    return os.access(existing, os.W_OK) and bool(mode & 0o222)


def candidates(trace: Path, cache_dir: Path | None) -> list[Path]:
    out = [beside(trace)]
    if cache_dir is not None:
        out.append(in_dir(trace, cache_dir))
    return out


def read_meta(entry: Path) -> dict[str, Any] | None:
    """The metadata of a cache entry: {"key": ..., "info": ...}, or None if unreadable."""
    try:
        meta = pl.read_parquet_metadata(entry)
        return json.loads(meta[_META])
    except Exception:  # noqa: BLE001 - a damaged or foreign file is simply not a cache hit
        return None


def lookup(
    trace: Path, cache_dir: Path | None, want: dict[str, Any] | None = None
) -> tuple[Path, dict] | None:
    """(entry, its metadata) of a cache entry matching the trace as it is now, or None."""
    want = want or key(trace)
    if want is None:
        return None
    for entry in candidates(trace, cache_dir):
        if entry.is_file():
            meta = read_meta(entry)
            if meta is not None and meta.get("key") == want:
                return entry, meta
    return None


def load(
    trace: Path,
    cache_dir: Path | None,
    columns: list[str] | None = None,
    want: dict[str, Any] | None = None,
) -> tuple[Any, pl.DataFrame] | None:
    """(TraceInfo, events) from a matching cache entry, or None (miss, stale or unreadable)."""
    from tracekit.events import EVENT_SCHEMA
    from tracekit.ingest.kineto import decode_info

    found = lookup(trace, cache_dir, want)
    if found is None:
        return None
    entry, meta = found
    try:
        frame = pl.read_parquet(entry, columns=columns)
        info = decode_info(json.dumps(meta["info"]).encode())
    except Exception:  # noqa: BLE001 - unreadable entry: parse the trace instead
        return None
    expected = {c: t for c, t in EVENT_SCHEMA.items() if columns is None or c in columns}
    if dict(frame.schema) != expected:
        return None
    import dataclasses

    return dataclasses.replace(info, path=Path(trace)), frame


def target(trace: Path, cache_dir: Path | None) -> Path | None:
    """Where a new entry for ``trace`` goes: beside it when its folder is writable, else the
    cache folder when that is, else nowhere."""
    if writable(Path(trace).parent):
        return beside(trace)
    if cache_dir is not None and writable(Path(cache_dir)):
        return in_dir(trace, cache_dir)
    return None


def store(
    trace: Path, info: Any, frame: pl.DataFrame, cache_dir: Path | None, want: dict[str, Any] | None
) -> Path | None:
    """Write the entry atomically (temporary name, then rename); None when it cannot be written.

    ``want`` is the key taken *before* the trace was read, so a trace rewritten meanwhile never
    gets an entry that claims its new contents.
    """
    from tracekit.ingest.kineto import encode_info

    dest = target(trace, cache_dir)
    if dest is None or want is None:
        return None
    meta = json.dumps({"key": want, "info": json.loads(encode_info(info))})
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        # zstd level 1: about as fast to write as lz4 and half the size; statistics are
        # useless here (the whole file is always read)
        frame.write_parquet(
            tmp, compression="zstd", compression_level=1, statistics=False, metadata={_META: meta}
        )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        return dest
    except Exception:  # noqa: BLE001 - the cache only saves time; never fail an analysis on it
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return None


def remove(trace: Path, cache_dir: Path | None) -> None:
    """Delete every cache entry of ``trace`` (benchmarks: a cold start)."""
    for entry in candidates(trace, cache_dir):
        entry.unlink(missing_ok=True)
