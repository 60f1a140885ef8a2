"""Profile your own training job into a run folder that ``tracekit analyze`` reads.

    import tracekit
    with tracekit.profile("runs") as prof:          # after init_process_group, on every rank
        for batch in loader:
            train_step(batch)
            prof.step()                              # once per training step
    # -> runs/user-<YYYYmmdd-HHMMSS>/  (its path: prof.run_dir)

What it does, on every rank:

- wraps ``torch.profiler.profile`` with ``schedule(wait, warmup, active, repeat)``: ``wait``
  steps untraced, ``warmup`` steps traced and discarded (the profiler's own start-up cost stays
  out), then ``active`` steps recorded as ``ProfilerStep#N``; with ``repeat`` > 1 each cycle
  replaces the last at ``traces/rank<R>.json.gz`` and the earlier ones move to
  ``traces/cycles/`` (``tracekit analyze`` reads the latest);
- agrees on the run folder: rank 0 creates ``<out_dir>/user-<stamp>`` and broadcasts it (or
  every rank uses ``run_dir=`` as given);
- gathers every rank's host, local rank, node and CPU threads: the topology in run.json
  (tracekit.capture.placement). Without an initialised process group it is a one-rank run;
- warns (``warnings.warn`` and run.json ``warnings``) when the ranks on one host run more
  threads than it has CPUs, and on NCCL when ``NCCL_DEBUG_FILE`` was not set before init;
- at the end dumps the flight recorder (``nccl/fr_rank<R>.json``), copies this process's NCCL
  log (``NCCL_DEBUG_FILE``, ``%h``/``%p`` expanded) into ``nccl/``, and rank 0 marks run.json
  ``status`` "ok" once every rank is done (a collective: every rank must leave the block).
  A rank that raises writes what it recorded and adds ``{rank, kind, message}`` to run.json
  ``errors`` (status "failed") without any collective, so it cannot hang on the others.

``tracekit.profiled(out_dir)`` decorates a train-step function (one call = one step; the
profiler starts at the first call and finishes after ``(wait + warmup + active) * repeat``
calls); ``tracekit.StepProfiler`` is the same object as a Lightning / Hugging Face style
callback (duck-typed: ``on_train_begin``/``on_train_start``, ``on_step_end``/
``on_train_batch_end``, ``on_train_end``; every other ``on_*`` hook does nothing).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import shutil
import signal
import sys
import threading
import time
import warnings as _warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tracekit import runfolder
from tracekit.capture import placement, records, step_contention, teardown, trace
from tracekit.capture.run_json_update import ProfileWarning, update_run_json

STRATEGY = "user"
F = TypeVar("F", bound=Callable[..., Any])


# --- run.json, shared by the ranks ----------------------------------------------------------------


def _versions(backend: str | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(records.versions())
    out["cuda"] = torch.version.cuda
    if backend and "nccl" in backend and torch.cuda.is_available():
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a version string is never worth failing for
            out["nccl"] = None
    return out


# --- the profiler --------------------------------------------------------------------------------


class Profiler:
    """One rank's profiling session; use through :func:`profile`, :func:`profiled` or
    :class:`StepProfiler`. ``step()`` once per training step."""

    def __init__(
        self,
        out_dir: str | Path | None = None,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
        run_dir: str | Path | None = None,
        device: str | None = None,
    ) -> None:
        if min(wait, warmup, repeat) < 0 or active < 1:
            raise ValueError("wait, warmup and repeat must be >= 0 and active >= 1")
        self.out_dir = Path(out_dir) if out_dir is not None else Path("runs")
        self.schedule = {"wait": wait, "warmup": warmup, "active": active, "repeat": repeat}
        self.options: dict[str, Any] = {
            "record_shapes": record_shapes,
            "profile_memory": profile_memory,
            "with_stack": with_stack,
        }
        self._given_run_dir = None if run_dir is None else Path(run_dir)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.run_dir: Path | None = None
        self.rank, self.world_size = 0, 1
        self.backend: str | None = None
        self.warnings: list[str] = []
        self.steps = 0
        self.cycles = 0
        self.started = self.stopped = False
        self._prof: torch.profiler.profile | None = None
        self._group: Any = None
        self._old_sigterm: Any = None
        self._contention: step_contention.StepContention | None = None

    # schedule bookkeeping
    @property
    def steps_per_cycle(self) -> int:
        s = self.schedule
        return s["wait"] + s["warmup"] + s["active"]

    @property
    def schedule_done(self) -> bool:
        """Every cycle of the schedule has been recorded (never, with repeat=0)."""
        return (
            self.schedule["repeat"] > 0
            and self.steps >= self.steps_per_cycle * self.schedule["repeat"]
        )

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        frame, level = inspect.currentframe(), 1
        while frame is not None and frame.f_code.co_filename == __file__:  # point at user code
            frame, level = frame.f_back, level + 1
        _warnings.warn(message, ProfileWarning, stacklevel=level)

    # --- start -------------------------------------------------------------------------------

    def start(self) -> Profiler:
        if self.started:
            raise RuntimeError("this profiler was already started")
        self.started = True
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.backend = str(dist.get_backend())
            # object collectives need a CPU-capable group; NCCL's is not one
            self._group = None if self.backend == "gloo" else dist.new_group(backend="gloo")
        else:
            claimed = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS")
            if claimed and claimed.isdigit() and int(claimed) > 1:
                self._warn(
                    f"the launcher says {claimed} ranks but torch.distributed is not "
                    "initialised: profiling this process as a one-rank run (call "
                    "init_process_group before tracekit.profile)"
                )
        self.run_dir = self._agree_on_run_dir(distributed)
        everyone: list[Any] = [placement.describe_rank(self.rank)]  # all ranks' once gathered
        if distributed:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, placement.describe_rank(self.rank), group=self._group)
        topo, source, notes = placement.topology(everyone)
        for note in notes + placement.oversubscription(everyone):
            self._warn(note)
        if self.backend and "nccl" in self.backend and not os.environ.get("NCCL_DEBUG_FILE"):
            self._warn(
                "no NCCL logs captured: set NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,"
                "TUNING NCCL_DEBUG_FILE=<dir>/%h.%p.log before init_process_group"
            )
        if self.rank == 0:
            runfolder.write_json_atomic(
                runfolder.run_json_path(self.run_dir), self._run_json(topo, source, everyone)
            )
        self._catch_sigterm()
        if distributed:  # the user's job may never destroy its group: see capture.teardown
            teardown.leave_process_group_at_exit()
        # the rank's CPU wait per step, and the co-run probe (a collective) before the first
        self._contention = step_contention.StepContention(self._group, self.device, self.world_size)
        self._prof = self._torch_profiler()
        self._prof.__enter__()
        return self

    def _agree_on_run_dir(self, distributed: bool) -> Path:
        if self._given_run_dir is not None:
            run = self._given_run_dir
        else:
            box: list[Any] = [None]
            if self.rank == 0:
                box[0] = str(
                    runfolder.new_run_dir(self.out_dir, STRATEGY, time.strftime("%Y%m%d-%H%M%S"))
                )
            if distributed:
                dist.broadcast_object_list(box, src=0, group=self._group)
            run = Path(box[0])
        run.mkdir(parents=True, exist_ok=True)
        return run.resolve()

    def _run_json(self, topo: list[dict], source: str, everyone: list[dict]) -> dict[str, Any]:
        gpu = (
            torch.cuda.get_device_name()
            if self.device.startswith("cuda") and torch.cuda.is_available()
            else None
        )
        env = records.environment(threads_per_rank=max(m["threads"] for m in everyone), gpu=gpu)
        env["threads_by_rank"] = [m["threads"] for m in sorted(everyone, key=lambda m: m["rank"])]
        return {
            "schema_version": runfolder.RUN_SCHEMA_VERSION,
            "strategy": STRATEGY,
            "config": {
                **self.schedule,
                **self.options,
                "steps": self.schedule["active"],
                "script": sys.argv[0] if sys.argv else None,
            },
            "world_size": self.world_size,
            "backend": self.backend,
            "device": self.device,
            "precision": None,
            "versions": _versions(self.backend),
            "environment": env,
            "launcher": placement.launcher(),
            "topology": topo,
            "topology_source": source,
            "status": "running",
            "errors": [],
            "warnings": list(self.warnings),
        }

    def _torch_profiler(self) -> torch.profiler.profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with _warnings.catch_warnings():
            _warnings.filterwarnings("ignore", message=".*warmup.*")
            return torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(**self.schedule),
                on_trace_ready=self._on_trace_ready,
                **self.options,
            )

    def _on_trace_ready(self, prof: torch.profiler.profile) -> None:
        """Each finished cycle: move the previous one to traces/cycles/, write this one."""
        assert self.run_dir is not None
        final = runfolder.trace_path(self.run_dir, self.rank)
        if final.exists():
            older = final.parent / "cycles" / f"rank{self.rank}.cycle{self.cycles}.json.gz"
            older.parent.mkdir(parents=True, exist_ok=True)
            os.replace(final, older)
        trace.export_trace(self.run_dir, self.rank)(prof)
        self.cycles += 1

    def _catch_sigterm(self) -> None:
        """torchrun stops the surviving ranks with SIGTERM when one fails: turn the first one
        into SystemExit so the block's exit writes what was recorded (only when nobody else
        handles SIGTERM, and only in the main thread). Later SIGTERMs, and one that arrives
        while an exception is already unwinding, raise nothing: they would cut the trace
        export short (torchrun's SIGKILL after its grace period is the backstop)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        self._old_sigterm = trace.exit_on_first_sigterm()

    # --- steps ----------------------------------------------------------------------------------

    def step(self) -> None:
        """Mark the end of one training step."""
        if self._prof is None or self.stopped:
            raise RuntimeError("step() outside a started profiler")
        assert self._contention is not None  # made with the profiler, in start()
        self._contention.end(self.steps)
        self.steps += 1
        self._prof.step()
        self._contention.begin()

    # --- stop -------------------------------------------------------------------------------------

    def stop(self, error: BaseException | None = None, *, sync: bool = True) -> None:
        """Write the trace (a cycle cut short too), flight recorder and NCCL log; update run.json.

        ``sync``: gather every rank's result before rank 0 marks the run "ok" (a collective:
        all ranks must call it). Never a collective after an error.
        """
        if self.stopped or not self.started:
            return
        self.stopped = True
        assert self.run_dir is not None and self._prof is not None
        try:
            self._prof.__exit__(None, None, None)
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            records.dump_flight_recorder(self.run_dir, self.rank)
        self._copy_nccl_log(self.run_dir)
        assert self._contention is not None
        traced = step_contention.traced_steps(self.schedule, self.cycles, self.steps)
        self._contention.write(self.run_dir, self.rank, traced)
        mine = {
            "rank": self.rank,
            "trace": runfolder.trace_path(self.run_dir, self.rank).is_file(),
            "steps": self.steps,
            "cycles": self.cycles,
        }
        group, self._group = self._group, None  # held past here, it outlives destroy (teardown)
        if error is not None:
            self._record_error(self.run_dir, error)
            return
        everyone: list[Any] = [mine]
        if sync and distributed:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine, group=group)
        if self.rank == 0:
            self._finish_run_json(self.run_dir, everyone)

    def _record_error(self, run_dir: Path, error: BaseException) -> None:
        if isinstance(error, KeyboardInterrupt):
            kind = "interrupted"
        elif isinstance(error, SystemExit):
            kind = "signal" if error.code == 128 + signal.SIGTERM else "exit"
        else:
            kind = "exception"
        message = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        entry = {"rank": self.rank, "kind": kind, "message": message}

        def change(data: dict[str, Any]) -> None:
            data["status"] = "failed"
            data.setdefault("errors", []).append(entry)

        update_run_json(run_dir, change)

    def _finish_run_json(self, run_dir: Path, everyone: list[dict[str, Any]]) -> None:
        notes = []
        need = self.steps_per_cycle
        if self.steps < need:
            taken = f"{self.steps} step" + ("" if self.steps == 1 else "s")
            notes.append(
                f"only {taken} taken; one cycle of the schedule needs "
                f"{need} (wait {self.schedule['wait']} + warmup {self.schedule['warmup']} "
                f"+ active {self.schedule['active']}): the trace is cut short"
            )
        without = sorted(m["rank"] for m in everyone if not m["trace"])
        if without:
            notes.append(f"ranks {without} wrote no trace")
        for note in notes:
            self._warn(note)

        def change(data: dict[str, Any]) -> None:
            data.setdefault("warnings", []).extend(notes)
            data["steps_taken"] = self.steps
            data["cycles"] = max(m["cycles"] for m in everyone)
            if data.get("status") == "running":
                data["status"] = "ok"

        update_run_json(run_dir, change)

    def _copy_nccl_log(self, run_dir: Path) -> None:
        src = placement.nccl_log_path()
        if src is None or not Path(src).is_file():
            return
        dst = runfolder.nccl_dir(run_dir) / Path(src).name
        if Path(src).resolve() == dst.resolve():
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError as exc:
            self._warn(f"could not copy the NCCL log {src}: {exc.strerror or exc}")
            tmp.unlink(missing_ok=True)

    # --- context manager ----------------------------------------------------------------------

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)


def profile(
    out_dir: str | Path | None = None,
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = False,
    run_dir: str | Path | None = None,
    device: str | None = None,
) -> Profiler:
    """``with tracekit.profile(out_dir) as prof: ... prof.step()``: see the module docstring.

    ``out_dir`` (default ``./runs``) is the parent of the new run folder ``user-<stamp>``;
    ``run_dir`` names the run folder itself instead. ``device`` adds CUDA activity when it is
    "cuda" (default: when CUDA is available).
    """
    return Profiler(
        out_dir,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        run_dir=run_dir,
        device=device,
    )


class StepProfiler(Profiler):
    """The profiler as a training-loop callback: start, step after each batch, stop at the end.

    Duck-typed for Hugging Face ``TrainerCallback`` (on_train_begin / on_step_end /
    on_train_end) and Lightning ``Callback`` (on_train_start / on_train_batch_end /
    on_train_end); any other ``on_*`` hook is accepted and ignored. It stops by itself once
    the schedule is done, so training past it costs nothing.
    """

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        if not self.started:
            self.start()

    on_train_start = on_train_begin

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        if not self.started:
            self.start()
        if self.stopped:
            return
        self.step()
        if self.schedule_done:
            self.stop()

    on_train_batch_end = on_step_end

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.stop()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def _stop_at_exit(self) -> None:
        """Interpreter exit before the schedule finished: write what there is, no collective."""
        if self.started and not self.stopped:
            self.stop(sync=False)


def profiled(out_dir: str | Path | None = None, **options: Any) -> Callable[[F], F]:
    """Decorate a train-step function: each call is one profiled step (options as :func:`profile`).

    The profiler starts at the first call and stops after ``(wait + warmup + active) * repeat``
    calls (or at interpreter exit); ``fn.profiler`` is the :class:`StepProfiler`.
    """

    def decorate(fn: F) -> F:
        prof = StepProfiler(out_dir, **options)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if prof.stopped:
                return fn(*args, **kwargs)
            if not prof.started:
                prof.start()
                atexit.register(prof._stop_at_exit)
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                prof.stop(exc)
                raise
            prof.on_step_end()
            return result

        wrapper.profiler = prof  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
