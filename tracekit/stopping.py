"""Stopping work that runs in other threads: when the thread waiting for it is interrupted, or a
deadline passes (issue #24: every wait interruptible and bounded).

Python runs signal handlers in the main thread only. A thread pool's worker busy in C code (the
trace scanner, tracekit/ingest/_kscan.c) never sees Ctrl-C, and leaving a ``with
ThreadPoolExecutor(...)`` block waits for every task: Ctrl-C during a long parse waited for
the parse. So work that may take long runs in a :class:`Scope`, which it checks at points of
its own choosing (:func:`check`; the scanner looks at the scope's :attr:`Scope.flag` byte every
megabyte, without the GIL):

    with stopping.ThreadPool(4, "tracekit-parse") as pool:   # tasks run in the pool's scope
        results = list(pool.map(parse, paths))                # Ctrl-C here stops the tasks

    with stopping.scope(timeout=60) as s:                     # a deadline (the Dash index)
        analyze(path)                                         # raises Stopped after 60 s

Leaving a :class:`ThreadPool` block by an exception (KeyboardInterrupt included) stops its
scope: queued tasks are cancelled, running ones raise :class:`Stopped` at their next check, and
the block's exit waits only for that. Scopes nest: a pool opened inside a scope stops with it.
The current scope travels in a context variable, which ThreadPool hands to each task it runs.
:class:`ProcessPool` is the same promise for spawned workers: they ignore Ctrl-C, and leaving
the block by an exception ends them.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class Stopped(BaseException):
    """Work stopped because its scope was (an interrupted waiter, a deadline). A BaseException,
    like KeyboardInterrupt: no ``except Exception`` on the way turns it into a result."""


class Scope:
    """A flag that stops the work running in it, and in the scopes opened inside it."""

    def __init__(self, parent: Scope | None = None) -> None:
        self.flag = bytearray(1)  # nonzero: stopped (the C scanner reads this byte)
        self.why = ""
        self._children: weakref.WeakSet[Scope] = weakref.WeakSet()
        self._lock = threading.Lock()
        if parent is not None:
            with parent._lock:
                parent._children.add(self)
                if parent.stopped:
                    self.flag[0], self.why = 1, parent.why

    @property
    def stopped(self) -> bool:
        return bool(self.flag[0])

    def stop(self, why: str = "stopped") -> None:
        """Stop this scope and every scope opened inside it (idempotent: the first reason stays)."""
        with self._lock:
            if not self.flag[0]:
                self.flag[0], self.why = 1, why
            children = list(self._children)
        for child in children:
            child.stop(why)

    def check(self) -> None:
        """Raise :class:`Stopped` if this scope was stopped."""
        if self.flag[0]:
            raise Stopped(self.why)


_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "tracekit_stopping_scope", default=None
)


def current() -> Scope | None:
    """The scope this code runs in, or None (nothing asks it to stop)."""
    return _CURRENT.get()


def check() -> None:
    """Raise :class:`Stopped` if the current scope was stopped."""
    s = _CURRENT.get()
    if s is not None:
        s.check()


def flag() -> bytearray | None:
    """The current scope's flag byte (for C code that cannot call :func:`check`), or None."""
    s = _CURRENT.get()
    return s.flag if s is not None else None


@contextmanager
def scope(timeout: float | None = None, why: str | None = None) -> Iterator[Scope]:
    """Run the block in a new scope inside the current one; stopped after ``timeout`` seconds
    (``why``: the reason it says then, default "took more than N s")."""
    s = Scope(current())
    timer = None
    if timeout is not None:
        timer = threading.Timer(timeout, s.stop, (why or f"took more than {timeout:g} s",))
        timer.daemon = True
        timer.start()
    token = _CURRENT.set(s)
    try:
        yield s
    finally:
        _CURRENT.reset(token)
        if timer is not None:
            timer.cancel()


#: how long a wait for a task blocks before it looks at signals again
WAIT_SLICE_S = 0.1


def result(future: Future[T]) -> T:
    """A Future's result, waited for in slices of WAIT_SLICE_S.

    A blocking wait is a futex wait, which the kernel restarts after a signal whose handler was
    installed with SA_RESTART, as polars installs its SIGINT handler: Python would see Ctrl-C
    only when the task ends. A timed wait comes back to Python, which then runs the handler."""
    while True:
        try:
            return future.result(timeout=WAIT_SLICE_S)
        except TimeoutError:
            continue


class _SlicedMap:
    """``map`` whose results are waited for with :func:`result` (Executor.map blocks)."""

    def map(self, fn: Callable[..., T], *iterables: Any, **_: Any) -> Iterator[T]:
        futures = [self.submit(fn, *args) for args in zip(*iterables)]  # type: ignore[attr-defined]

        def results() -> Iterator[T]:
            try:
                for future in futures:
                    yield result(future)
            finally:
                for future in futures:
                    future.cancel()

        return results()


class ThreadPool(_SlicedMap, ThreadPoolExecutor):
    """A ThreadPoolExecutor whose tasks run in a scope of its own, inside the submitter's: an
    exception leaving the ``with`` block (Ctrl-C) stops them, so the exit waits only until
    each running task reaches its next check, never for the whole of its work. ``map`` waits
    in slices (:func:`result`)."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(max(1, workers), thread_name_prefix=name)
        self.scope = Scope(current())

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        context = contextvars.copy_context()  # one per task: a context runs in one thread
        context.run(_CURRENT.set, self.scope)
        return super().submit(context.run, fn, *args, **kwargs)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc_type is not None:
            self.scope.stop(f"stopped ({exc_type.__name__})")
        self.shutdown(wait=True, cancel_futures=exc_type is not None)
        return False


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessPool(_SlicedMap, ProcessPoolExecutor):
    """A ProcessPoolExecutor (spawned workers) that owns its workers: they ignore Ctrl-C (the
    terminal sends it to every process of the foreground group; a worker would print a
    KeyboardInterrupt traceback of its own), and an exception leaving the ``with`` block
    cancels the queued tasks and ends the workers at once instead of waiting for their tasks.
    ``map`` waits in slices (:func:`result`)."""

    def __init__(self, workers: int, mp_context: Any) -> None:
        super().__init__(max(1, workers), mp_context=mp_context, initializer=_ignore_sigint)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc_type is not None:
            # the pool's own worker table: there is no public way to end its workers (3.14
            # adds terminate_workers)
            for process in list((getattr(self, "_processes", None) or {}).values()):
                process.terminate()
        self.shutdown(wait=True, cancel_futures=exc_type is not None)
        return False
