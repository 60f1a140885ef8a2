"""Capture: what any training loop calls to fill a run folder (traces, memory, losses, flight recorder).

    with capture.profile(run, rank, steps=3) as prof:      # after your own unprofiled warm-up
        for _ in range(3):
            train_step()
            prof.step()                                      # marks ProfilerStep#<n>
    capture.write_memory(run, rank, capture.model_states(params, grads, optimizer, step=k))
    capture.write_train(run, rank, losses)
    capture.dump_flight_recorder(run, rank)

The profiler records CPU activity (and CUDA when the device is a GPU) with shapes and memory
events, no Python stacks, for exactly ``steps`` steps (``schedule(wait=0, warmup=0, active=steps)``),
and writes ``traces/rank<R>.json.gz`` through a temporary name, so a trace is never half-written.

Model-state bytes are counted from the tensors themselves: the byte ranges of their storages,
unioned per storage, so a gradient that is a view into a bucket buffer (DDP's
``gradient_as_bucket_view``) or a parameter that views a flat shard is counted once, and a buffer
nobody views is not counted. This module never imports ``instrumented_runs``.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tracekit import runfolder

# --- the profiler -------------------------------------------------------------------------------


def _default_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


EVENTS_PARQUET_ENV = "TRACEKIT_EVENTS_PARQUET"


def write_events_parquet(trace: Path | str) -> Path | None:
    """Ingest at source: parse this rank's finished trace into ``<trace>.events.parquet`` beside it.

    The file is tracekit's columnar cache entry (tracekit.cache: events table + TraceInfo,
    keyed by the trace's size, mtime and CRC-32), so `tracekit analyze` reads it, not the JSON:
    every rank converts its own trace in parallel at the end of the job, and a thousand-rank
    job never funnels raw JSON through one machine. Never fails the run: a problem is one line
    on stderr and None.
    """
    trace = Path(trace)
    try:
        from tracekit import cache
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


def _export_trace(run: Path, rank: int, events_parquet: bool = False):  # noqa: ANN202 - on_trace_ready callback
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
def profile(
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
    beside its trace (:func:`write_events_parquet`: ingest at source).
    """
    if events_parquet is None:
        events_parquet = os.environ.get(EVENTS_PARQUET_ENV, "") not in ("", "0")
    if steps < 1:
        raise ValueError("steps must be at least 1")
    rank = _default_rank() if rank is None else rank
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
            on_trace_ready=_export_trace(Path(run), rank, events_parquet),
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


# --- model-state memory -------------------------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2 / TP parameters), the tensor itself otherwise."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def count_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes the tensors occupy: their storage byte ranges, unioned per storage (views count once)."""
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        t = _local(t)
        if t.numel() == 0 or t.device.type == "meta":
            continue
        size = t.element_size()
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        start = t.storage_offset() * size
        key = (str(t.device), t.untyped_storage().data_ptr())
        spans.setdefault(key, []).append((start, start + extent * size))
    total = 0
    for ranges in spans.values():
        ranges.sort()
        cur_start, cur_end = ranges[0]
        for s, e in ranges[1:]:
            if s > cur_end:
                total += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        total += cur_end - cur_start
    return total


def _optimizer_tensors(optimizer: Any) -> dict[str, list[torch.Tensor]]:
    """Optimizer state tensors by key (exp_avg, exp_avg_sq, step, ...)."""
    by_key: dict[str, list[torch.Tensor]] = {}
    if isinstance(optimizer, torch.optim.Optimizer):
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    by_key.setdefault(str(key), []).append(value)
    else:
        by_key["state"] = [t for t in optimizer if isinstance(t, torch.Tensor)]
    return by_key


def model_states(
    params: Iterable[torch.Tensor],
    grads: Iterable[torch.Tensor | None],
    optimizer: torch.optim.Optimizer | Iterable[torch.Tensor],
    *,
    step: int | None = None,
    extra_optimizer: Iterable[torch.Tensor] = (),
) -> dict[str, Any]:
    """Count a rank's model states from its tensors.

    params: every parameter copy the rank keeps for compute; grads: the ``.grad`` tensors (or
    the bucket buffers they view); optimizer: an Optimizer (every tensor in ``optimizer.state``)
    or the tensors themselves; extra_optimizer: further optimizer-owned tensors such as fp32
    master weights kept outside ``optimizer.state``. ``step`` is the training step counted at.
    """
    t0 = time.perf_counter()
    params = list(params)
    by_key = _optimizer_tensors(optimizer)
    extra = list(extra_optimizer)
    if extra:
        by_key.setdefault("master", []).extend(extra)
    p_bytes = count_bytes(params)
    g_bytes = count_bytes(grads)
    o_by_key = {k: count_bytes(v) for k, v in by_key.items()}
    o_bytes = count_bytes(t for v in by_key.values() for t in v)
    return {
        "step": step,
        "params_numel": sum(_local(p).numel() for p in params),
        "params_bytes": p_bytes,
        "grads_bytes": g_bytes,
        "optimizer_bytes": o_bytes,
        "optimizer_bytes_by_key": o_by_key,
        "model_states_bytes": p_bytes + g_bytes + o_bytes,
        "count_s": time.perf_counter() - t0,
    }


class ActivationMeter:
    """Bytes of activations kept for backward: live now, and the peak, on this rank.

    Inside ``with meter:`` every tensor autograd saves for backward passes a pack hook
    (``torch.autograd.graph.saved_tensors_hooks``); its storage is counted once however many ops
    save it, and released when autograd drops the last saved reference (after its backward, or
    when the graph is freed). Parameters (and any tensor in ``exclude``) are model states, not
    activations, and are skipped. ``peak_bytes`` is what GPipe-vs-1F1B and activation
    checkpointing change; ``reset_peak()`` starts a new measurement (e.g. per step).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {_local(t).untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, list[int]] = {}  # storage ptr -> [saved references, bytes]
        self.current_bytes = 0
        self.peak_bytes = 0
        self._hooks: Any = None

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        self._exclude.update(_local(t).untyped_storage().data_ptr() for t in tensors)

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes

    def _pack(self, t: torch.Tensor) -> Any:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return t
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key in self._exclude or key == 0:
            return t
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [1, storage.nbytes()]
            self.current_bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        else:
            entry[0] += 1
        return _Saved(
            self, key, t.detach()
        )  # detached: holding an output with its grad_fn would be a cycle

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current_bytes -= entry[1]
            del self._live[key]

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved

    def __enter__(self) -> ActivationMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None


class _Saved:
    """A saved tensor whose release tells the meter (autograd drops it after use)."""

    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter: ActivationMeter, key: int, tensor: torch.Tensor) -> None:
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        self.meter._release(self.key)


def write_memory(run: Path | str, rank: int, states: dict[str, Any]) -> Path:
    """Write ``memory/rank<R>.json`` (the dict from :func:`model_states`, plus rank and device peak)."""
    data = {"rank": rank, **states}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        data["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    path = runfolder.memory_path(Path(run), rank)
    runfolder.write_json_atomic(path, data)
    return path


def write_train(run: Path | str, rank: int, losses: list[float], **extra: Any) -> Path:
    """Write ``train/rank<R>.json``: this rank's local loss per step (plus e.g. step times)."""
    path = runfolder.train_path(Path(run), rank)
    runfolder.write_json_atomic(path, {"rank": rank, "losses": [float(x) for x in losses], **extra})
    return path


# --- parameters (tests compare them with the single-process reference) --------------------------


def params_path(run: Path | str, rank: int) -> Path:
    return runfolder.train_path(Path(run), rank).parent / f"params_rank{rank}.pt"


def save_params(run: Path | str, rank: int, state: dict[str, torch.Tensor]) -> Path:
    """``train/params_rank<R>.pt``: a CPU state dict (load with ``torch.load(weights_only=True)``)."""
    path = params_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    torch.save({k: _local(v).detach().cpu().clone() for k, v in state.items()}, tmp)
    os.replace(tmp, path)
    return path


def load_params(run: Path | str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(params_path(run, rank), weights_only=True, map_location="cpu")


# --- run.json helpers ----------------------------------------------------------------------------

ENV_PREFIXES = ("NCCL_", "OMP_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "MKL_")


def versions() -> dict[str, str]:
    """run.json ``versions``: python, torch, tracekit."""
    import tracekit

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tracekit": tracekit.__version__,
    }


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(threads_per_rank: int | None = None, gpu: str | None = None) -> dict[str, Any]:
    """run.json ``environment``: cpu model, threads per rank, NCCL_*/OMP_*/GLOO_*/... variables."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads_per_rank": torch.get_num_threads()
        if threads_per_rank is None
        else threads_per_rank,
        "platform": platform.platform(),
        "gpu": gpu,
        "variables": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


# --- flight recorder ----------------------------------------------------------------------------


def flight_recorder_path(run: Path | str, rank: int) -> Path:
    return runfolder.nccl_dir(Path(run)) / f"fr_rank{rank}.json"


def dump_flight_recorder(run: Path | str, rank: int) -> Path | None:
    """Write PyTorch's flight-recorder JSON to ``nccl/fr_rank<R>.json``; None (never an error) if unavailable."""
    try:
        dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
        if dump is None:
            return None
        raw = dump(includeCollectives=True, onlyActive=False)
        text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
        path = flight_recorder_path(run, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
        return path
    except Exception as exc:  # noqa: BLE001 - a diagnostic must never fail the run
        print(
            f"tracekit: flight recorder dump skipped on rank {rank}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return None
