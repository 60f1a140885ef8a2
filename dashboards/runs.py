"""The runs the app shows and their analyses, cached in memory.

``Runs`` lists the runs under ROOT (dashboards.root, refreshed every few seconds) and analyses
in memory given by name, resolves ``?run=`` by dashboards.root's rule, and keeps an LRU of a few
analyses keyed by path and the files' mtimes and sizes: a run is analysed once however many
callbacks ask, and again when a trace or its run.json changes. An ``Entry`` memoizes what the
pages build from its analysis (figures, tables), each once, on first use.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dashboards.root import find_runs, resolve
from tracekit import runfolder

CACHE_SIZE = 4
LISTING_S = 5


@dataclass
class Entry:
    """One run's analysis and what the pages built from it."""

    analysis: Any
    memo: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def memoized(self, name: str, build: Callable[[], Any]) -> Any:
        """``build()`` the first time NAME is asked for, the same object afterwards."""
        with self.lock:
            if name not in self.memo:
                self.memo[name] = build()
            return self.memo[name]


class Runs:
    """The runs under ROOT, ?run= resolution, and the LRU cache of their analyses."""

    def __init__(
        self, root: Path, preloaded: Mapping[str, Any] | None = None, cache_size: int = CACHE_SIZE
    ):
        self.root = Path(root).resolve()
        self.preloaded = {str(k): Entry(v) for k, v in (preloaded or {}).items()}
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[tuple, threading.Lock] = {}
        self._listing: tuple[float, list[str]] | None = None

    def list_runs(self) -> list[str]:
        """Run folders and trace folders under ROOT (relative, posix), then the preloaded names;
        refreshed every few seconds."""
        now = time.monotonic()
        if self._listing and now - self._listing[0] < LISTING_S:
            return self._listing[1]
        runs = find_runs(self.root) + sorted(self.preloaded)
        self._listing = (now, runs)
        return runs

    def resolve(self, rel: str) -> Path | str:
        """The run's resolved path (or a preloaded name); Refused when it is not one under ROOT."""
        return resolve(self.root, rel, self.preloaded)

    def _signature(self, path: Path) -> tuple:
        files = runfolder.find_trace_files(path)
        extra = [runfolder.run_json_path(path)] if path.is_dir() else []
        sig = []
        for f in files + extra:
            try:
                st = f.stat()
            except OSError:
                continue
            sig.append((str(f), st.st_mtime_ns, st.st_size))
        return tuple(sig)

    def entry(self, rel: str) -> Entry:
        """The cached analysis of ?run=REL (analysing it on first use); Refused / TracekitError."""
        path = self.resolve(rel)
        if isinstance(path, str):
            return self.preloaded[path]
        key = (str(path), self._signature(path))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            build = self._building.setdefault(key, threading.Lock())
        with build:  # one analysis per run at a time, however many callbacks ask
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    return hit
            from tracekit.analysis import analyze

            result = Entry(analyze(path))
            with self._lock:
                for old in [k for k in self._cache if k[0] == key[0]]:
                    del self._cache[old]
                self._cache[key] = result
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
                self._building.pop(key, None)
            return result

    def cached(self, key: tuple) -> Entry | None:
        """The analysis cached under (path, signature), if any; never starts one."""
        with self._lock:
            return self._cache.get(key)

    def message(self, exc: Exception) -> str:
        """An error as the page shows it: one line, ROOT's own location left out."""
        return str(exc).replace(str(self.root), "ROOT")
