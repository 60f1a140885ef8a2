"""Model-state memory and activation bytes, counted from the tensors a rank holds.

    memory.write_memory(run, rank, memory.model_states(params, grads, optimizer, step=k))

Model-state bytes are counted from the tensors themselves: the byte ranges of their storages,
unioned per storage, so a gradient that is a view into a bucket buffer (DDP's
``gradient_as_bucket_view``) or a parameter that views a flat shard is counted once, and a buffer
nobody views is not counted. :class:`ActivationMeter` counts what autograd saves for backward.
This module never imports a strategy.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from tracekit import runfolder


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2 / TP parameters), the tensor itself otherwise."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def count_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes the tensors occupy: their storage byte ranges, unioned per storage (views count once)."""
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        t = local_shard(t)
        if t.numel() == 0 or t.device.type == "meta":
            continue
        size = t.element_size()
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        start = t.storage_offset() * size
        key = (str(t.device), t.untyped_storage().data_ptr())
        spans.setdefault(key, []).append(
            (int(start), int(start + extent * size))
        )  # torch types them int | SymInt
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
        "params_numel": sum(local_shard(p).numel() for p in params),
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
        self._exclude = {local_shard(t).untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, list[int]] = {}  # storage ptr -> [saved references, bytes]
        self.current_bytes = 0
        self.peak_bytes = 0
        self._hooks: Any = None

    def exclude_only(self, tensors: Iterable[torch.Tensor]) -> None:
        """Skip exactly these tensors' storages from now on: those skipped before are counted
        again (their memory may since have been given to activations)."""
        self._exclude = {local_shard(t).untyped_storage().data_ptr() for t in tensors}

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes

    def _pack(self, t: torch.Tensor) -> Any:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return t
        storage = local_shard(t).untyped_storage()
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
