"""Types of the C scanner (tracekit/ingest/_kscan.c, built at install)."""

from typing import Any

def scan(
    data: bytes | bytearray,
    stop: bytearray | None = None,
) -> tuple[int, list[str], tuple[Any, Any], dict[str, tuple[int, int]]] | None:
    """(events, distinct texts, the columns' Arrow (schema, array) capsules, byte spans of the
    top-level keys), or None when it declines the file (the msgspec path then reads it) or
    stops because ``stop[0]`` was set (tracekit.stopping). In the main thread it runs Python's
    signal handlers every megabyte: Ctrl-C raises KeyboardInterrupt out of it."""

def abort_line(line: bytes) -> None:
    """From now on a SIGABRT in this process (a library's allocation failing: Rust aborts) writes
    LINE to stderr and exits with status 2, instead of a core dump and status 134."""

def split(data: bytes | bytearray | memoryview, start: int) -> tuple[int, bool]:
    """Where a run of whole elements of a JSON array ends in ``data[start:]`` (which begins
    between two elements): (just after the last one closed at depth 0, or ``start``; True when
    the array's own ``]`` was found, at that end)."""
