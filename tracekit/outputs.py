"""Writing into places the user named, without harming what is there (docs/bad-input.md).

- A file output (report, perfetto export, parquet, cache entry) only ever replaces a regular
  file: a symlink, FIFO, device or folder at that path is refused (:func:`check_file_target`).
- Everything is written under a temporary name in the destination's folder, then renamed. The
  temporary name holds the writer's pid (:func:`temp_name`), so leftovers of a killed run are
  recognised and swept by the next one (:func:`sweep`): only our own names, and only when their
  owner is gone or they are older than :data:`STALE_S`.
- A write that fails (full disk, quota, file too large) is one line naming the reason
  (:func:`reason`), with the temporary output removed.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import time
from pathlib import Path

from tracekit.errors import TracekitError

#: leftovers older than this are swept even when their pid is alive (pids are reused)
STALE_S = 3600.0
#: ``.<name>.tmp-<pid>-<random>`` (folders), ``.<name>.<pid>-<random>.tmp[<ext>]`` (files) and
#: ``.<name>.old-<pid>`` (an analysis moved aside): our temporary names with an owner
_OWNED = re.compile(r"^\..+\.(?:tmp-(\d+)-\w+|(\d+)-\w+\.tmp(?:\.\w+)?|old-(\d+))$")
#: names of older versions, without a pid: ``.<name>.tmp-<8 random>`` (mkdtemp) and
#: ``.<name>.<8 random>.tmp[<ext>]`` (mkstemp); swept when older than STALE_S only
_LEGACY = re.compile(r"^\..+\.(?:tmp-[a-z0-9_]{8}|[a-z0-9_]{8}\.tmp(?:\.\w+)?)$")

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def kind_of(path: Path) -> str | None:
    """What is at PATH when it is not a regular file ("a FIFO", ...); None for a regular file
    or nothing. The link itself is looked at, never what it points to."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError:
        return "something that cannot be looked at"
    for test, name in _KINDS:
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_file_target(path: Path, option: str) -> None:
    """Refuse an output path that exists and is not a regular file (TracekitError)."""
    what = kind_of(path)
    if what is not None:
        raise TracekitError(
            f"is {what}, not a regular file: tracekit never replaces it; choose another place "
            f"with {option}",
            path,
        )


def temp_name(dest: Path, folder: bool = False, suffix: str = "") -> Path:
    """A fresh temporary path beside DEST carrying our pid (see _OWNED)."""
    token = os.urandom(4).hex()
    name = (
        f".{dest.name}.tmp-{os.getpid()}-{token}"
        if folder
        else f".{dest.name}.{os.getpid()}-{token}.tmp{suffix}"
    )
    return dest.with_name(name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def sweep(folder: Path, now: float | None = None) -> int:
    """Remove our temporary leftovers in FOLDER whose owner is gone or that are older than
    STALE_S; the number removed. Never raises (a sweep only tidies)."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        owned, legacy = _OWNED.match(entry.name), _LEGACY.match(entry.name)
        if not owned and not legacy:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        old = now - st.st_mtime > STALE_S
        pid = int(next(g for g in owned.groups() if g)) if owned else None
        if not old and (pid is None or pid == os.getpid() or _pid_alive(pid)):
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:
            pass
    return removed


_OS_ERROR = re.compile(r"\(os error (\d+)\)")
#: what a write into the destination fails with: full disk or quota, file too large, read-only
#: or unwritable place, I/O error (other OSErrors are not about where we write)
_WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EIO,
}


def _errno(exc: BaseException) -> int | None:
    if isinstance(exc, OSError):
        return exc.errno
    match = _OS_ERROR.search(str(exc))
    return int(match.group(1)) if match else None


def reason(exc: BaseException) -> str | None:
    """The OS reason behind a failed write ("No space left on device"), from an OSError or a
    polars error that wraps one ("... (os error 28)"); None when there is none."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    code = _errno(exc)
    return os.strerror(code) if code is not None else None


def is_write_failure(exc: BaseException) -> bool:
    """A write that failed for lack of space or permission (an OSError, or a polars error
    caused by one: polars wraps I/O errors in ComputeError)."""
    if not isinstance(exc, OSError):
        try:
            import polars as pl
        except ImportError:
            return False
        if not isinstance(exc, pl.exceptions.PolarsError):
            return False
    return _errno(exc) in _WRITE_ERRNOS


def writable(path: Path) -> bool:
    """Writable and not marked read-only (root bypasses the bits, but a folder without any
    write bit is one its owner meant to keep as it is: shared trace archives)."""
    existing = Path(path)
    while not existing.exists():
        if existing.parent == existing:
            return False
        existing = existing.parent
    try:
        mode = existing.stat().st_mode
    except OSError:
        return False
    return os.access(existing, os.W_OK) and bool(mode & 0o222)
