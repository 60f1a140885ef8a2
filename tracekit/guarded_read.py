"""The one guarded reader of input files: every file tracekit reads from a user goes through here.

    fd = open_regular(path)                  regular files only, never blocking, symlinks resolved
    data = read_limited(path, limit)         at most LIMIT bytes read (else one-line error)
    value = load_json(path)                  the above, then JSON within a nesting bound
    n = in_range(value, 0, 2**31)            a number that may size or type something, or None

What it guards against (docs/bad-input.md): a FIFO (an open would block forever: O_NONBLOCK,
then fstat), a socket or a device, also behind a symlink (``memory/rank0.json -> /dev/zero``
would be read until MemoryError: the link is resolved first, the target opened with O_NOFOLLOW
and must itself be a regular file), a file larger than its kind's limit, and JSON nested so deep
that a decoder recurses past Python's stack (one line, not RecursionError). Every problem is a
TracekitError naming the file: the CLI shows it as one line and exit status 2; the side files an
analysis can do without turn it into a warning.

The trace reader (tracekit.ingest.kineto_files) opens through :func:`open_regular` and keeps its
own size rule (:func:`~tracekit.ingest.kineto_files.max_trace_bytes`, gzip bombs). Nothing here
imports polars.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError


class Unread(TracekitError):
    """An input file that was not read (not a regular file, over its size limit): a reader of
    files the analysis can do without turns it into a warning naming the file."""


#: side files (run.json, memory/, contention/, summary.json, markers) are a few KB; this is
#: generous and still far from what would exhaust memory when parsed (~10x as Python objects)
SIDE_FILE_BYTES = 64 << 20
#: deepest JSON nesting accepted: tracekit's own files nest < 10 levels, Kineto args < 8;
#: Python's decoders recurse once per level and stop at ~1000 with a RecursionError
MAX_DEPTH = 200

_KINDS = (  # the one table of what a path that is not a regular file is (also tracekit.outputs)
    (stat.S_ISLNK, "a symbolic link"),  # lstat's answer; fstat never gives it
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO", "a socket", ...)."""
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


def _refuse(path: Path, real: str, mode: int) -> TracekitError:
    kind = kind_of(mode)
    if os.path.islink(path):  # say where the link leads: /dev/zero is the usual case
        return TracekitError(
            f"is a symbolic link to {kind} ({real}), not a regular file: not read", path
        )
    return TracekitError(f"is {kind}, not a regular file: not read", path)


def open_regular(path: str | Path) -> int:
    """A read-only file descriptor of PATH, which must be a regular file (after symlinks).

    Symlinks are resolved first and the target opened with O_NOFOLLOW (a link swapped in
    between fails, never is followed) and O_NONBLOCK (a FIFO opens at once instead of waiting
    for a writer); fstat then refuses anything but a regular file. The caller closes the fd.
    """
    path = Path(path)
    real = os.path.realpath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO on some systems) cannot be opened
            try:
                mode = os.stat(real).st_mode
            except OSError:
                mode = None
            if mode is not None:
                raise _refuse(path, real, mode) from None
        if exc.errno == errno.ELOOP:
            raise TracekitError(
                "is a symbolic link that changed while read: not read", path
            ) from None
        raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(path, real, st.st_mode)
    return fd


def _too_large(path: Path, size: int, limit: int, at_least: bool = False) -> TracekitError:
    over = "more than " if at_least else ""
    return TracekitError(
        f"file too large to read: {over}{size / 1e6:.1f} MB, over the limit of "
        f"{limit / 1e6:.1f} MB for this kind of file",
        path,
    )


def read_fd_limited(fd: int, path: Path, limit: int) -> bytes:
    """Everything FD holds, at most LIMIT bytes (a file that grows while read is cut there)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise _too_large(path, size, limit)
    chunks, total = [], 0
    while True:  # size is only a hint (a file may grow): never read more than limit + 1
        piece = os.read(fd, min(max(size - total, 1 << 16), limit + 1 - total))
        if not piece:
            break
        chunks.append(piece)
        total += len(piece)
        if total > limit:
            raise _too_large(path, total, limit, at_least=True)
    return b"".join(chunks)


def read_limited(path: str | Path, limit: int = SIDE_FILE_BYTES) -> bytes:
    """PATH's bytes, a regular file of at most LIMIT bytes; TracekitError otherwise."""
    path = Path(path)
    fd = open_regular(path)
    try:
        return read_fd_limited(fd, path, limit)
    except OSError as exc:
        raise TracekitError(f"cannot read the file ({exc.strerror or exc})", path) from None
    finally:
        os.close(fd)


_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_PARENS = bytes.maketrans(b"[{]}", b"(())")


def nesting_depth(data: bytes | bytearray | memoryview) -> int:
    """How deep DATA's JSON arrays and objects nest (brackets inside strings not counted), up to
    MAX_DEPTH + 1 (deeper is not counted further).

    At C speed: the brackets alone, as parentheses, lose every innermost pair ``()`` per pass,
    so the passes count the depth (a 23 MB flight-recorder dump: about half the time msgspec takes to decode it). A file
    with fewer openers than MAX_DEPTH cannot be deeper: not looked at.
    """
    raw = bytes(data)
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return MAX_DEPTH  # at most this: never over the bound
    # strings out: escaped backslashes, then escaped quotes, then every other piece between quotes
    unquoted = raw.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[0::2]
    rest = b"".join(unquoted).translate(_PARENS, _BRACKETS)
    depth = 0
    while b"()" in rest and depth <= MAX_DEPTH:
        rest = rest.replace(b"()", b"")
        depth += 1
    return depth


def check_depth(data: bytes | bytearray | memoryview, path: str | Path) -> None:
    """TracekitError when DATA nests deeper than MAX_DEPTH (decoders would recurse past it)."""
    if nesting_depth(data) > MAX_DEPTH:
        raise TracekitError(f"JSON nested more than {MAX_DEPTH} levels deep: not read", path)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(data: bytes | bytearray, path: str | Path, *, finite: bool = True) -> Any:
    """DATA as JSON, nesting bounded. ``finite``: NaN, Infinity and 1e400 refused (what is
    echoed into summary.json must stay valid JSON); else read as Python reads them, for readers
    that check each figure (tracekit.ingest.contention_record: a NaN figure is unknown)."""
    check_depth(data, path)
    strict: dict[str, Any] = (
        {"parse_constant": _no_constant, "parse_float": _finite_float} if finite else {}
    )
    try:
        value = json.loads(data, **strict)
    except RecursionError:  # MAX_DEPTH is well under the recursion limit: belt and braces
        raise TracekitError("JSON nested too deeply: not read", path) from None
    except (ValueError, TypeError) as exc:
        raise TracekitError(f"not valid JSON ({exc})", path) from None
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def read_json_bytes(path: str | Path, limit: int = SIDE_FILE_BYTES) -> bytes:
    """PATH's bytes (:func:`read_limited`), checked to nest at most MAX_DEPTH deep: for readers
    that decode with a decoder of their own (msgspec, a schema)."""
    data = read_limited(path, limit)
    check_depth(data, path)
    return data


def load_json(path: str | Path, limit: int = SIDE_FILE_BYTES, *, finite: bool = True) -> Any:
    """PATH read (:func:`read_limited`) and decoded (:func:`decode_json`)."""
    return decode_json(read_limited(path, limit), path, finite=finite)


#: ranks are 0 .. 2^31-1 (torch's int32, the Int32 rank column)
RANK_LIMIT = 2**31


def in_range(value: Any, low: int, high: int) -> int | None:
    """VALUE when it is an int in [LOW, HIGH), else None: the check a number passes before it
    sizes or types anything (bools, floats, text, 2^63 and negative values are not sizes)."""
    return value if type(value) is int and low <= value < high else None


def rank_list(value: Any, world: int | None = None) -> list[int] | None:
    """VALUE when it is a non-empty list of ranks (ints in [0, WORLD), or below RANK_LIMIT when
    the world size is unknown), else None: a group's ranks before they size or index anything."""
    high = world if world is not None else RANK_LIMIT
    if not isinstance(value, list) or not value:
        return None
    ranks = [in_range(r, 0, high) for r in value]
    return None if None in ranks else [r for r in ranks if r is not None]
