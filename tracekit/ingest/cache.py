"""The columnar cache: each trace file's events table as parquet, reused while the trace is unchanged.

Parsing JSON is most of what `tracekit analyze` costs; reading the same events back from
parquet costs a few percent of it. So ingest keeps, per trace file, one parquet file holding
its events frame (exactly EVENT_SCHEMA) with the file's TraceInfo and the cache key in the
parquet key-value metadata (one file: the table and what it describes can never disagree).

Where:

1. a per-user cache folder (tracekit.ingest.cache_paths.default_dir: ``$TRACEKIT_CACHE_DIR``,
   else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``; ``--cache-dir`` overrides), as
   ``<name>-<hash of the trace's resolved path>.events.parquet``. The entry also records that
   path, so two traces never share an entry. The folder is capped at
   ``$TRACEKIT_CACHE_MAX_BYTES`` (default 5 GiB): the entries used longest ago go first (a hit
   marks an entry used by touching it). New entries always go here;
2. beside the trace, ``traces/rank0.json.gz`` -> ``traces/rank0.events.parquet``, written only
   by a run's own ranks when they finish (ingest at source, tracekit.capture, in the run folder
   tracekit made), so a thousand-rank job never funnels raw JSON through one machine. Read
   when present; analysing never writes beside a trace (folders of other people's traces stay
   as they are).

Key: the trace's size, mtime (ns) and CRC-32 of its bytes (a rewrite that keeps size and mtime
is still seen), the tracekit version, and a fingerprint of the ingest code (the source of the
modules that decide what a row holds), so an entry written by other code is never read back.
Any entry that does not match, cannot be read or lacks a column is ignored and rewritten; a
cache that cannot be written is skipped silently (it only saves time).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import stat
import threading
import zlib
from pathlib import Path
from typing import Any

import polars as pl

from tracekit import guarded_read, outputs
from tracekit._version import __version__
from tracekit.errors import TracekitError
from tracekit.events import EVENT_SCHEMA
from tracekit.ingest.cache_paths import (
    SUFFIX,
    beside,
    candidates,
    in_dir,
    resolved,
)
from tracekit.ingest.kineto_info import TraceInfo, decode_info, encode_info

FORMAT = 2  # bump when the layout of a cache entry changes (2: content CRC in the key)
MAX_BYTES_ENV = "TRACEKIT_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 5 * 2**30
_META = "tracekit.cache"
_CODE = (
    "events.py",
    "runfolder.py",
    "cache.py",
    "ingest/kineto.py",
    "ingest/kineto_files.py",
    "ingest/kineto_decode.py",
    "ingest/kineto_classify.py",
    "ingest/kineto_info.py",
    "ingest/collectives.py",
    "ingest/devices.py",
    "ingest/_kscan.c",
)
_CHUNK = 1 << 20
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """tracekit version + cache format + a hash of the ingest code's source."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha1(f"{__version__}|{FORMAT}".encode())
    for name in _CODE:
        try:
            digest.update((root / name).read_bytes())
        except OSError:
            digest.update(name.encode())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def max_bytes() -> int:
    """The cap on the cache folder's size ($TRACEKIT_CACHE_MAX_BYTES: bytes, or 500M, 5G)."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip().lower().removesuffix("b").removesuffix("i")
    if not text:
        return DEFAULT_MAX_BYTES
    unit = text[-1] if text[-1] in "kmgt" else ""
    try:
        number = float(text.removesuffix(unit))
        if not number >= 0 or number == float("inf"):
            raise ValueError(text)
        return int(number * _UNITS[unit])
    except (ValueError, OverflowError):
        raise TracekitError(
            f"{MAX_BYTES_ENV}={os.environ[MAX_BYTES_ENV]!r} is not a number of bytes "
            "(e.g. 5000000000 or 5G)"
        ) from None


# (resolved path, dev, inode, size, mtime, ctime) -> CRC: each file's bytes are hashed once per
# process however often its key is asked for (rank selection, lookup, store)
_crc_memo: dict[tuple, int] = {}
_crc_lock = threading.Lock()


def _crc(trace: Path, st: os.stat_result) -> int | None:
    memo = (str(trace), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _crc_lock:
        if memo in _crc_memo:
            return _crc_memo[memo]
    crc = 0
    try:
        with os.fdopen(guarded_read.open_regular(trace), "rb", buffering=0) as f:
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            while n := f.readinto(buf):
                crc = zlib.crc32(view[:n], crc)  # ~1.6 GB/s, without the GIL
    except (OSError, TracekitError):
        return None
    with _crc_lock:
        _crc_memo[memo] = crc
    return crc


def key(trace: Path) -> dict[str, Any] | None:
    """What identifies this version of the trace file (None when it cannot be read)."""
    trace = Path(trace)
    try:
        st = trace.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None  # a FIFO or device has no stable content to key on
    crc = _crc(trace, st)
    if crc is None:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "crc32": crc, "code": fingerprint()}


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
    near, far = candidates(trace, cache_dir)
    for entry in (near, far):
        if entry.is_file() and not entry.is_symlink():
            meta = read_meta(entry)
            if meta is None or meta.get("key") != want:
                continue
            if entry is far:
                if meta.get("path") != resolved(trace):
                    continue  # another trace's entry (a hash collision): never its events
                try:
                    os.utime(entry)  # last use: eviction removes the longest unused first
                except OSError:
                    pass
            return entry, meta
    return None


def load(
    trace: Path,
    cache_dir: Path | None,
    columns: list[str] | None = None,
    want: dict[str, Any] | None = None,
) -> tuple[TraceInfo, pl.DataFrame] | None:
    """(TraceInfo, events) from a matching cache entry, or None (miss, stale or unreadable)."""
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
    return dataclasses.replace(info, path=Path(trace)), frame


def target(trace: Path, cache_dir: Path | None, at_source: bool = False) -> Path | None:
    """Where a new entry for ``trace`` goes: the cache folder (``at_source``: beside the trace)
    when it is writable, else nowhere."""
    dest = beside(trace) if at_source else in_dir(trace, cache_dir)
    return dest if outputs.writable(dest.parent) else None


# cache folder -> bytes in it as last counted (plus what this process added since): the folder
# is listed once per process, and again only when it goes over the cap
_sizes: dict[str, int] = {}
_sizes_lock = threading.Lock()


def is_entry(path: Path) -> bool:
    """PATH is a cache entry tracekit wrote: a regular file whose parquet metadata holds our
    key (written with the entry). A user's own ``*.events.parquet`` is not, whatever its name."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    meta = read_meta(path)
    return isinstance(meta, dict) and isinstance(meta.get("key"), dict) and "code" in meta["key"]


def _entries(where: Path) -> list[tuple[float, int, Path]]:
    """The entries of cache folder WHERE that prove ours (:func:`is_entry`): only they are
    counted and only they are ever evicted."""
    out = []
    for entry in os.scandir(where):
        if (
            entry.name.endswith(SUFFIX)
            and entry.is_file(follow_symlinks=False)
            and is_entry(Path(entry.path))
        ):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append((st.st_mtime, st.st_size, Path(entry.path)))
    return out


def evict(where: Path, cap: int | None = None) -> int:
    """Delete the entries of cache folder WHERE used longest ago until it holds at most CAP
    bytes (default :func:`max_bytes`); the bytes it holds now."""
    cap = max_bytes() if cap is None else cap
    entries = sorted(_entries(where))
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if total <= cap:
            break
        try:
            path.unlink()
            total -= size
        except OSError:
            pass
    return total


def _account(where: Path, added: int) -> None:
    with _sizes_lock:
        name = str(where)
        if name not in _sizes:
            outputs.sweep(where)  # temp files of writers killed before they finished
            _sizes[name] = evict(where)
            return
        _sizes[name] += added
        if _sizes[name] > max_bytes():
            _sizes[name] = evict(where)


def store(
    trace: Path,
    info: TraceInfo,
    frame: pl.DataFrame | pl.LazyFrame,
    cache_dir: Path | None,
    want: dict[str, Any] | None,
    *,
    at_source: bool = False,
) -> Path | None:
    """Write the entry atomically (temporary name, then rename); None when it cannot be written.

    ``want`` is the key taken *before* the trace was read; the entry is written only if the
    trace still has it, so a trace rewritten meanwhile never gets an entry that claims its new
    contents. ``at_source``: beside the trace (ingest at source, in a run folder we made).
    """
    dest = target(trace, cache_dir, at_source)
    if dest is None or want is None or outputs.kind_of(dest) is not None:
        return None
    if key(trace) != want:
        return None
    meta = json.dumps(
        {
            "key": want,
            "path": resolved(trace),
            "info": json.loads(encode_info(info)),
        }
    )
    tmp = outputs.temp_name(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # uncompressed: 28 % less CPU to write and 35 % less to read than zstd level 1 (8 x 30
        # MB ranks: 0.28 / 0.05 CPU-s instead of 0.39 / 0.07), for files 2.5x larger (about
        # the size of the gzipped trace); statistics are useless here (the whole file is read)
        if isinstance(frame, pl.LazyFrame):  # a rank read in parts: written as it is read
            frame.sink_parquet(
                tmp, compression="uncompressed", statistics=False, metadata={_META: meta}
            )
        else:
            frame.write_parquet(
                tmp, compression="uncompressed", statistics=False, metadata={_META: meta}
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        if not at_source:
            _account(dest.parent, dest.stat().st_size)
        return dest
    except Exception:  # noqa: BLE001 - the cache only saves time; never fail an analysis on it
        tmp.unlink(missing_ok=True)
        return None


def remove(trace: Path, cache_dir: Path | None = None) -> None:
    """Delete every cache entry of ``trace``: beside it, in CACHE_DIR and in the default cache
    folder (benchmarks: a cold start)."""
    for entry in {*candidates(trace, cache_dir), in_dir(trace, None)}:
        if is_entry(entry):  # never a user's file that only has an entry's name
            entry.unlink(missing_ok=True)
