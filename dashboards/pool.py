"""The app's analyses in the background: a few at a time, each bounded in time (issue #24).

One thread analysing runs in turn let one run whose read never returns (memory/rank0.json a
FIFO, a dead network mount) hold every run queued after it at "analysing…" forever, and the
page request for that run never answered. A :class:`Pool` runs jobs on ``workers`` threads;
a job still running ``timeout_s`` after it started is finished as failed ("analysis took
longer than N s") and the others go on:

- its scope is stopped (tracekit.stopping), so work that checks (the C scanner, every task of
  an analysis pool) ends at its next check and its thread comes back;
- its thread is written off and a new one started in its place, so a read that never checks
  (``open()`` of a FIFO blocks in the kernel; a Python thread cannot be killed) costs one
  idle thread, not a worker. At most ``workers + max_stuck`` threads exist: with that many
  stuck, none is started in their place and jobs fail at once, saying so (restart the app);
  a stuck read that returns ends its thread, and the pool takes jobs again.

A job is deduplicated by its key while it is queued or running; what it returned, or why it
failed (one line), is the caller's to keep.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tracekit import stopping

#: threads written off at once (each blocked in a read that never returns) before the pool
#: stops starting new ones: a bound on what a folder of FIFOs can cost the app
MAX_STUCK = 8


class Job:
    """One analysis: queued, running, then done with ``value`` or ``error`` (one line)."""

    def __init__(self, key: Any, fn: Callable[[], Any]) -> None:
        self.key = key
        self.fn = fn
        self.value: Any = None
        self.error: str | None = None
        self.exception: Exception | None = None  # what fn() raised (None: a timeout)
        self.timed_out = False
        self.created = time.monotonic()
        self.started: float | None = None
        self.scope: stopping.Scope | None = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Whether the job is done, waiting at most ``timeout`` seconds for it."""
        return self._done.wait(timeout)


class Pool:
    """``workers`` threads running :class:`Job` s, each failed after ``timeout_s`` running."""

    def __init__(
        self, workers: int, timeout_s: float, name: str, nice: int = 0, max_stuck: int = MAX_STUCK
    ) -> None:
        self.workers = max(1, workers)
        self.timeout_s = timeout_s
        self.name = name
        self.nice = nice
        self.max_stuck = max_stuck
        self._lock = threading.Lock()
        self._jobs: dict[Any, Job] = {}  # queued or running, by key
        self._todo: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._live = 0  # threads taking jobs
        self._stuck = 0  # threads written off, still inside their job
        self._started = 0

    def timeout_message(self) -> str:
        return f"analysis took longer than {self.timeout_s:g} s"

    def submit(self, key: Any, fn: Callable[[], Any]) -> Job:
        """The job for KEY: the one queued or running, else a new one running ``fn()``."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                return job
            job = Job(key, fn)
            if self._live == 0 and self._stuck >= self.max_stuck:
                self._finish(job, error=self._full_message())
                return job
            self._jobs[key] = job
            self._top_up()
        self._todo.put(job)
        return job

    def _full_message(self) -> str:
        return (
            f"{self._stuck} analyses are stuck in reads that never return "
            "(FIFOs or hung mounts?); restart tracekit dash"
        )

    def _top_up(self) -> None:
        """Start threads up to ``workers`` live ones, within the bound on stuck ones (locked)."""
        while (
            self._live < self.workers and self._live + self._stuck < self.workers + self.max_stuck
        ):
            self._live += 1
            self._started += 1
            threading.Thread(
                target=self._work, name=f"{self.name}-{self._started}", daemon=True
            ).start()

    def _finish(
        self, job: Job, value: Any = None, error: str | None = None, exc: Exception | None = None
    ) -> bool:
        """Finish JOB once (locked); False when it was already finished (by its timeout)."""
        if job.done:
            return False
        job.value, job.error, job.exception = value, error, exc
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
        job._done.set()
        return True

    def _expire(self, job: Job, written_off: threading.Event) -> None:
        """JOB ran past the timeout: fail it, stop its scope, replace its thread."""
        with self._lock:
            if not self._finish(job, error=self.timeout_message()):
                return
            job.timed_out = True
            written_off.set()
            self._live -= 1
            self._stuck += 1
            self._top_up()
            if self._live == 0:  # nobody left to take the queue: say why, never wait forever
                for queued in list(self._jobs.values()):
                    if queued.started is None:
                        self._finish(queued, error=self._full_message())
        if job.scope is not None:
            job.scope.stop(self.timeout_message())

    def _work(self) -> None:
        if self.nice:
            try:  # Linux niceness is per thread: the pages a user waits for go first
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):
                pass
        while True:
            job = self._todo.get()
            with self._lock:
                if job.done:  # failed while queued (the pool was full of stuck threads)
                    continue
                job.started = time.monotonic()
            written_off = threading.Event()
            timer = threading.Timer(self.timeout_s, self._expire, (job, written_off))
            timer.daemon = True
            value, error, raised = None, None, None
            with stopping.scope() as job.scope:
                timer.start()
                try:
                    value = job.fn()
                except stopping.Stopped as exc:
                    error = str(exc) or self.timeout_message()
                except Exception as exc:  # noqa: BLE001 - one bad run must not stop the others
                    error, raised = " ".join(str(exc).split()) or type(exc).__name__, exc
                finally:
                    timer.cancel()
            with self._lock:
                self._finish(job, value, error, raised)
                if written_off.is_set():  # replaced while it was stuck: this thread ends
                    self._stuck -= 1
                    self._top_up()
                    return
