"""The runs the app shows and their analyses, cached in memory.

``Runs`` lists the runs under ROOT (dashboards.root, refreshed every few seconds) and analyses
in memory given by name, resolves ``?run=`` by dashboards.root's rule, and keeps an LRU of a few
analyses keyed by path and the files' mtimes and sizes: a run is analysed once however many
callbacks ask, and again when a trace or its run.json changes. Analyses run in a bounded pool
(dashboards.pool), each failed after ``analysis_timeout_s``: a page request always answers. An
``Entry`` memoizes what the pages build from its analysis (figures, tables), each once, on
first use.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dashboards.pool import Job, Pool
from dashboards.root import find_runs, resolve
from tracekit import runfolder, stopping
from tracekit.errors import TracekitError

CACHE_SIZE = 4
LISTING_S = 5
#: a run whose analysis takes longer is shown as failed, saying so (tracekit dash
#: --analysis-timeout); its thread is stopped or written off (dashboards.pool)
ANALYSIS_TIMEOUT_S = 300.0
PAGE_WORKERS = 4  # analyses for pages at once (the index has its own pool)
WAIT_SLACK_S = 2.0  # a page waits this much past the timeout for its job to be failed


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
        self,
        root: Path,
        preloaded: Mapping[str, Any] | None = None,
        cache_size: int = CACHE_SIZE,
        analysis_timeout_s: float = ANALYSIS_TIMEOUT_S,
    ):
        self.root = Path(root).resolve()
        self.preloaded = {str(k): Entry(v) for k, v in (preloaded or {}).items()}
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.pool = Pool(PAGE_WORKERS, analysis_timeout_s, "tracekit-page")
        self._jobs: dict[tuple, Job] = {}  # the analysis of each path under way (or timed out)
        self._timed_out: dict[tuple, str] = {}
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
        """The cached analysis of ?run=REL (analysing it on first use); Refused / TracekitError.

        The analysis runs in the page pool (dashboards.pool): this waits at most the pool's
        timeout and a little more, so a request for a run whose read never returns answers
        "analysis took longer than N s", and so does every later one for it (until its files
        change: the key holds their mtimes), at once, without another thread stuck on it."""
        path = self.resolve(rel)
        if isinstance(path, str):
            return self.preloaded[path]
        key = (str(path), self._signature(path))
        for _ in range(2):  # a second time only when the LRU dropped it as it came in
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return hit
                if key in self._timed_out:
                    raise TracekitError(self._timed_out[key])
                job = self._jobs.get(key)
                if job is None or (job.done and not job.timed_out):
                    job = self.pool.submit(key, lambda: self._analyse(key, path))
                    for old in [k for k in self._jobs if k[0] == key[0]]:
                        del self._jobs[old]
                    self._jobs[key] = job
            if not job.wait(self.pool.timeout_s + WAIT_SLACK_S):
                raise TracekitError(
                    f"still waiting for a free analysis worker after "
                    f"{self.pool.timeout_s + WAIT_SLACK_S:g} s; reload the page in a moment"
                )
            with self._lock:
                if self._jobs.get(key) is job:
                    del self._jobs[key]
            if job.timed_out:
                self.note_timeout(key, job.error or self.pool.timeout_message())
            if isinstance(job.exception, TracekitError):
                raise job.exception
            if job.error is not None:
                raise TracekitError(job.error)
        raise TracekitError("analysed, but dropped from the cache at once; reload the page")

    def _analyse(self, key: tuple, path: Path) -> None:
        """Analyse PATH into the cache under KEY (in a pool thread)."""
        from tracekit.analysis import analyze

        result = Entry(analyze(path))
        scope = stopping.current()
        if scope is not None and scope.stopped:
            return  # failed by its timeout meanwhile: the page says so, never shows it later
        with self._lock:
            for old in [k for k in self._cache if k[0] == key[0]]:
                del self._cache[old]
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def note_timeout(self, key: tuple, message: str) -> None:
        """The analysis of KEY ran past the timeout (here or in the index): later requests for
        it answer MESSAGE at once."""
        with self._lock:
            for old in [k for k in self._timed_out if k[0] == key[0]]:
                del self._timed_out[old]
            self._timed_out[key] = message

    def timed_out(self, key: tuple) -> str | None:
        """Why KEY is not analysed (it ran past the timeout), or None."""
        with self._lock:
            return self._timed_out.get(key)

    def cached(self, key: tuple) -> Entry | None:
        """The analysis cached under (path, signature), if any; never starts one."""
        with self._lock:
            return self._cache.get(key)

    def message(self, exc: Exception) -> str:
        """An error as the page shows it: one line, ROOT's own location left out."""
        return str(exc).replace(str(self.root), "ROOT")
