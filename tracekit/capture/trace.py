"""The in-rank profiler: exactly ``steps`` training steps into ``traces/rank<R>.json.gz``.

    with trace.profile_steps(run, rank, steps=3) as prof:   # after your own unprofiled warm-up
        for _ in range(3):
            train_step()
            prof.step()                                    # marks ProfilerStep#<n>

The profiler records CPU activity (and CUDA when the device is a GPU) with shapes and memory
events, no Python stacks, for exactly ``steps`` steps (``schedule(wait=0, warmup=0, active=steps)``),
and writes ``traces/rank<R>.json.gz`` through a temporary name, so a trace is never half-written.
This is what the reference strategies' harness uses; ``tracekit.profile``
(tracekit.capture.profiler) is the same for a user's own job, with its run.json.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tracekit import runfolder
from tracekit.capture import straggler, teardown


@contextmanager
def region(name: str) -> Iterator[None]:
    """``with region(label): ...``: a ``record_function`` span named by a tracekit.labels label.

    Every strategy's forward and backward run inside one, so on a planted straggler's rank
    (``--straggler``) this is where its extra compute goes, inside the same span
    (tracekit.capture.straggler)."""
    slow = straggler.active()
    if slow is not None:
        slow.before(name)
    with torch.profiler.record_function(name):
        if slow is None:
            yield
        else:
            with slow.phase(name):
                yield


def _default_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


EVENTS_PARQUET_ENV = "TRACEKIT_EVENTS_PARQUET"


def write_events_parquet(trace: Path | str) -> Path | None:
    """Ingest at source: parse this rank's finished trace into ``<trace>.events.parquet`` beside it.

    The file is tracekit's columnar cache entry (tracekit.ingest.cache: events table + TraceInfo,
    keyed by the trace's size, mtime and CRC-32), so `tracekit analyze` reads it, not the JSON:
    every rank converts its own trace in parallel at the end of the job, and a thousand-rank
    job never funnels raw JSON through one machine. Never fails the run: a problem is one line
    on stderr and None.
    """
    trace = Path(trace)
    try:
        from tracekit.ingest import cache
        from tracekit.ingest.kineto import read_trace

        want = cache.key(trace)
        info, frame = read_trace(trace)
        return cache.store(trace, info, frame, None, want, at_source=True)
    except Exception as exc:  # noqa: BLE001 - a speed-up must never fail the run
        print(
            f"tracekit: {trace}: events parquet skipped: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return None


def export_trace(run: Path, rank: int, events_parquet: bool = False):  # noqa: ANN202 - on_trace_ready callback
    def ready(prof: torch.profiler.profile) -> None:
        final = runfolder.trace_path(run, rank)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{os.getpid()}.tmp.json.gz"  # must end in .gz: gzip
        try:
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        if events_parquet:
            write_events_parquet(final)

    return ready


@contextmanager
def profile_steps(
    run: Path | str,
    rank: int | None = None,
    steps: int = 3,
    device: str = "cpu",
    events_parquet: bool | None = None,
) -> Iterator[torch.profiler.profile]:
    """Profile the next ``steps`` steps (call ``prof.step()`` after each) into ``traces/rank<R>.json.gz``.

    ``rank`` defaults to the process group rank (0 without one). ``device="cuda"`` adds CUDA
    activity. If the body raises, whatever was recorded is still written. ``events_parquet``
    (default: environment ``TRACEKIT_EVENTS_PARQUET=1``) also writes the rank's parsed events
    beside its trace (:func:`write_events_parquet`: ingest at source). In a process group, the
    group is left and freed at exit (capture.teardown), whether or not the job destroys it.
    """
    if events_parquet is None:
        events_parquet = os.environ.get(EVENTS_PARQUET_ENV, "") not in ("", "0")
    if steps < 1:
        raise ValueError("steps must be at least 1")
    rank = _default_rank() if rank is None else rank
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # the profiler pins the group past destroy_process_group (capture.teardown): without
        # this a job aborted at exit about one run in ten (tests/test_exit_teardown.py)
        teardown.leave_process_group_at_exit()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with warnings.catch_warnings():
        # "Profiler won't be using warmup": the caller ran its own unprofiled warm-up steps.
        warnings.filterwarnings("ignore", message=".*warmup.*")
        # "Profiler clears events at the end of each cycle": we record exactly one cycle.
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            on_trace_ready=export_trace(Path(run), rank, events_parquet),
            record_shapes=True,
            profile_memory=True,
            with_stack=False,
        )
        with prof:
            yield prof


def exit_on_first_sigterm() -> Any:
    """Make the first SIGTERM raise SystemExit (so the profiler writes what it recorded and the
    flight recorder is dumped); return the previous handler.

    torchrun (after another rank failed) and the launcher (timeout, Ctrl-C) stop ranks with
    SIGTERM. Later SIGTERMs are ignored (torchrun forwards the launcher's, so two arrive
    together; the second must not cut the trace export short), and so is one that arrives while
    an exception is already unwinding (a peer died, our collective failed): the SIGKILL that
    torchrun and the launcher send after their grace periods is the backstop.
    """
    raised: list[bool] = []

    def handler(signum: int, frame: object) -> None:
        if raised or sys.exc_info()[0] is not None:
            return
        raised.append(True)
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)
