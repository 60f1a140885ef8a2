"""Reading traces ahead while `tracekit analyze` imports polars and the analyses.

Those imports take the first quarter second of a run, on one core. Meanwhile a thread reads,
gunzips and scans (the C scanner, tracekit.ingest._kscan) the first traces the analysis will
parse: all three release the GIL, and none needs polars. tracekit.ingest.kineto_files.read_bytes
then takes the bytes read ahead (:func:`take`, when the file is still the one that was read)
and tracekit.ingest.kineto_decode their scan (:func:`take_scan`). The CLI starts it
(tracekit.ingest.kineto_files.prefetch) and stops it when the imports are done. Nothing here
imports polars, nor the module that reads files (the reader is handed in).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracekit import stopping

Reader = Callable[[Path], bytes | bytearray]

#: JSON read ahead at most (memory held until the parse takes it)
PREFETCH_BYTES = 256 << 20


def _identity(path: Path) -> tuple | None:
    """What says a file is still the one read: device, inode, size, mtime, ctime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _ReadAhead:
    """Files planned for reading ahead, and what was read: one reader thread, in plan order.

    A file is claimed once, by the thread or by :meth:`take` (a parse that comes first reads it
    itself); a claimed file is waited for. Results are handed out once and dropped if the file
    changed since (:func:`_identity`).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.plan: list[str] = []  # not claimed yet
        self.pending: dict[str, threading.Event] = {}  # claimed by the thread, being read
        self.done: dict[str, tuple[tuple | None, bytes | bytearray | None, Any]] = {}
        self.scans: dict[int, tuple[bytes | bytearray, Any]] = {}  # id(bytes) -> scan
        self.stopped = threading.Event()
        self.scope = stopping.Scope()  # stopped by discard(): a scan under way ends early

    def start(self, paths: Sequence[Path], read: Reader, budget: int) -> threading.Thread:
        with self.lock:
            self.plan = [os.path.abspath(p) for p in paths]
            self.stopped.clear()
            self.scope = stopping.Scope()
        thread = threading.Thread(
            target=self._run, args=(read, budget), name="tracekit-read-ahead", daemon=True
        )
        thread.start()
        return thread

    def _claim(self) -> tuple[str, threading.Event] | None:
        with self.lock:
            if self.stopped.is_set() or not self.plan:
                return None
            name = self.plan.pop(0)
            self.pending[name] = threading.Event()
            return name, self.pending[name]

    def _run(self, read: Reader, budget: int) -> None:
        try:
            from tracekit.ingest import _kscan
        except ImportError:  # built without a C compiler: read ahead, scan later
            _kscan = None  # type: ignore[assignment]
        done, scope = 0, self.scope
        while done < budget and (claim := self._claim()) is not None:
            name, event = claim
            ident, data, scanned = _identity(Path(name)), None, None
            try:
                data = read(Path(name))
                scanned = _kscan.scan(data, scope.flag) if _kscan is not None else None
                done += len(data)
            except Exception:  # noqa: BLE001 - the parse reads it again and words the error
                data = scanned = None
            with self.lock:
                self.done[name] = (ident, data, scanned)
                del self.pending[name]
            event.set()

    def take(self, path: Path) -> bytes | bytearray | None:
        """The bytes read ahead for PATH, or None (not planned, failed, or changed since)."""
        name = os.path.abspath(path)
        with self.lock:
            if name in self.plan:
                self.plan.remove(name)  # the thread has not started it: read it here
                return None
            event = self.pending.get(name)
        if event is not None:
            while not event.wait(0.05):  # in slices: a stopped parse does not wait for this read
                stopping.check()
        with self.lock:
            ident, data, scanned = self.done.pop(name, (None, None, None))
            if data is None or ident is None or ident != _identity(Path(name)):
                return None
            if scanned is not None:
                self.scans[id(data)] = (data, scanned)
            return data

    def take_scan(self, data: bytes | bytearray) -> Any:
        with self.lock:
            held, scanned = self.scans.pop(id(data), (None, None))
        return scanned if held is data else None

    def stop(self) -> None:
        with self.lock:
            self.stopped.set()
            self.plan.clear()

    def discard(self) -> None:
        self.stop()
        with self.lock:
            self.scope.stop("read-ahead discarded")
            self.done.clear()
            self.scans.clear()


_READ_AHEAD = _ReadAhead()


def start(paths: Sequence[Path], read: Reader, budget: int = PREFETCH_BYTES) -> threading.Thread:
    """Start reading PATHS ahead with READ (a file's JSON bytes), in order, in a thread of their
    own (returned), until :func:`stop` or BUDGET bytes of JSON; :func:`take` hands them out."""
    return _READ_AHEAD.start(paths, read, budget)


def take(path: Path) -> bytes | bytearray | None:
    """The bytes read ahead for PATH, or None (not planned, failed, or changed since)."""
    return _READ_AHEAD.take(path)


def take_scan(data: bytes | bytearray) -> Any:
    """The C scanner's result for DATA when the read-ahead scanned it (once), else None."""
    return _READ_AHEAD.take_scan(data)


def stop() -> None:
    """Start no further file (the one being read is finished and kept)."""
    _READ_AHEAD.stop()


def discard() -> None:
    """Drop whatever was read ahead and not taken."""
    _READ_AHEAD.discard()
