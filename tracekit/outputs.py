"""Writing into places the user named, without harming what is there (docs/bad-input.md).

- A file output (report, perfetto export, parquet, cache entry) only ever replaces a regular
  file: a symlink, FIFO, device or folder at that path is refused (:func:`check_file_target`).
- Everything is written under a temporary name in the destination's folder, then renamed
  (:func:`temp_name`). Leftovers of a killed run are removed by the next one (:func:`sweep`) only
  when ownership is proven, never by a name alone: a temporary *folder* we make holds an owner
  marker (:func:`make_owned_folder`: a file whose line repeats the folder's pid and random
  token), and only such a folder, whose pid is gone or that is older than :data:`STALE_S`, is
  ever swept. Temporary *files* and folders without the marker are never swept (a killed
  writer's dotfile stays: harmless, and removable by hand).
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

from tracekit import guarded_read
from tracekit.errors import TracekitError

#: leftovers older than this are swept even when their pid is alive (pids are reused)
STALE_S = 3600.0
#: ``.<name>.tmp-<pid>-<token>``: the name of a temporary folder of ours (:func:`temp_name`)
_FOLDER_NAME = re.compile(r"^\..+\.tmp-(\d+)-([0-9a-f]{8})$")
#: the owner marker inside a temporary folder we made (:func:`make_owned_folder`)
OWNER_FILE = ".tracekit-owner"


def kind_of(path: Path) -> str | None:
    """What is at PATH when it is not a regular file ("a FIFO", ...); None for a regular file
    or nothing. The link itself is looked at, never what it points to."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError:
        return "something that cannot be looked at"
    return None if stat.S_ISREG(mode) else guarded_read.kind_of(mode)


#: what a run wrote of itself (its run.json beside them): records no output may write over
RECORD_FOLDERS = ("traces", "memory", "contention", "train", "nccl", "logs")


def run_record_of(path: Path) -> Path | None:
    """The run folder (one with a run.json; tracekit.runfolder's layout, which this lower layer
    may not import) whose own records PATH is: its run.json, or inside one of its
    RECORD_FOLDERS, looking up to three folders above; None otherwise. An output never lands
    there, whether or not the command reads that run."""
    path = Path(os.path.abspath(path))
    for depth, folder in enumerate(list(path.parents)[:4]):
        rel = path.relative_to(folder).parts
        mine = rel == ("run.json",) or (depth > 0 and rel[0] in RECORD_FOLDERS)
        if mine and (folder / "run.json").is_file():
            return folder
    return None


def check_file_target(path: Path, option: str) -> None:
    """Refuse an output path that exists and is not a regular file, or is a read-only one (no
    write bit: its owner meant to keep it; root could replace it) (TracekitError)."""
    what = kind_of(path)
    if what is not None:
        raise TracekitError(
            f"is {what}, not a regular file: tracekit never replaces it; choose another place "
            f"with {option}",
            path,
        )
    run = run_record_of(path)
    if run is not None:
        raise TracekitError(
            f"is inside the records of run {run}: tracekit never writes there; choose another "
            f"place with {option}",
            path,
        )
    try:
        read_only = not os.lstat(path).st_mode & 0o222
    except OSError:
        return
    if read_only:
        raise TracekitError(
            f"is a read-only file: tracekit never replaces it; choose another place with {option}",
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


def _owner_line(pid: str, token: str) -> str:
    return f"tracekit temporary folder pid={pid} token={token}\n"


def make_owned_folder(path: Path, mode: int = 0o777) -> None:
    """Make PATH (a :func:`temp_name` folder, which must not exist) with its owner marker: the
    only proof :func:`sweep` accepts that the folder is ours."""
    match = _FOLDER_NAME.match(path.name)
    if match is None:
        raise ValueError(f"{path.name!r} is not a temporary folder name of ours")
    path.mkdir(mode=mode)
    (path / OWNER_FILE).write_text(_owner_line(*match.groups()))


def release(path: Path) -> None:
    """Remove the owner marker from a temporary folder about to become a result (renamed into
    place), so the result holds only what its writer wrote."""
    (path / OWNER_FILE).unlink(missing_ok=True)


def owner_pid(path: Path) -> int | None:
    """The pid of the tracekit process that made folder PATH, when PATH proves it: a real folder
    (not a link) named as ours whose owner marker is a regular file holding exactly the line
    that repeats the name's pid and token. None for everything else."""
    match = _FOLDER_NAME.match(path.name)
    if match is None:
        return None
    marker = path / OWNER_FILE
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode) or not stat.S_ISREG(os.lstat(marker).st_mode):
            return None
        if os.lstat(marker).st_size > 200:
            return None
        if marker.read_text() != _owner_line(*match.groups()):
            return None
    except (OSError, UnicodeDecodeError):
        return None
    return int(match.group(1))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def sweep(folder: Path, now: float | None = None) -> int:
    """Remove the temporary folders in FOLDER that prove to be ours (:func:`owner_pid`) and whose
    owner is gone or that are older than STALE_S; the number removed. Nothing else in FOLDER is
    ever touched, whatever its name. Never raises (a sweep only tidies)."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        pid = owner_pid(Path(entry.path))
        if pid is None:
            continue
        try:
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_S
        except OSError:
            continue
        if not old and (pid == os.getpid() or _pid_alive(pid)):
            continue
        try:
            shutil.rmtree(entry.path)
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
