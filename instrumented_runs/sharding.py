"""Flat-parameter partitioning shared by ZeRO stages 1-3 (Rajbhandari et al., arXiv:1910.02054).

A group of parameters (the whole model for ZeRO-1, one gradient bucket for ZeRO-2, one unit for
ZeRO-3) is laid out end to end in one flat buffer, padded with zeros to a multiple of the
data-parallel degree N, so that rank r owns the contiguous slice

    shard_r = flat[r s : (r+1) s],     s = ceil(numel / N)

Reduce-scatter hands rank r exactly the sum of everybody's gradients over its slice; all-gather
rebuilds the flat buffer from the N slices. The padding (under N elements per group) has zero
gradients, so Adam leaves it at zero. The model's parameters become *views* into the flat buffer
(``param.data = flat[offset : offset + numel].view(shape)``), so the strategy moves one tensor per
group and the model computes on it unchanged.

:class:`ShardOptimizer` is the update each rank applies to its own slices only, whatever the stage:

    fp32        Adam on the shard itself (an ``nn.Parameter`` aliasing the slice): 8 bytes of
                moments per owned element (the paper's K=8 with fp32 weights)
    bf16-mixed  Adam on an fp32 master copy of the shard, written back to the bf16 slice after
                the step: 4 (master) + 8 (moments) = 12 bytes per owned element (the paper's K=12)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from instrumented_runs.model import make_optimizer
from tracekit.capture import ActivationMeter


@dataclass
class FlatGroup:
    """Where each parameter of a group lives in the group's flat buffer, and who owns what."""

    index: int
    params: list[nn.Parameter]
    names: list[str]
    world_size: int
    offsets: list[int] = field(default_factory=list)
    numel: int = 0  # real elements
    padded: int = 0  # numel rounded up to a multiple of world_size

    def __post_init__(self) -> None:
        offset = 0
        for p in self.params:
            self.offsets.append(offset)
            offset += p.numel()
        self.numel = offset
        self.padded = math.ceil(offset / self.world_size) * self.world_size

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world_size

    def shard(self, flat: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s slice of ``flat`` (a view)."""
        s = self.shard_numel
        return flat[rank * s : (rank + 1) * s]

    def flatten(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new padded flat buffer holding the parameters' current values."""
        first = self.params[0]
        flat = torch.zeros(self.padded, dtype=dtype or first.dtype, device=first.device)
        for p, offset in zip(self.params, self.offsets):
            flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view into ``flat``."""
        return [flat[o : o + p.numel()].view_as(p) for p, o in zip(self.params, self.offsets)]

    def bind_params(self, flat: torch.Tensor) -> None:
        """Make every parameter a view into ``flat`` (the model then computes on the buffer)."""
        for p, view in zip(self.params, self.views(flat)):
            p.data = view

    def describe(self) -> dict:
        return {
            "index": self.index,
            "numel": self.numel,
            "padded": self.padded,
            "shard_numel": self.shard_numel,
            "params": self.names,
        }


def split_into_buckets(
    named: list[tuple[str, nn.Parameter]], cap_bytes: float
) -> list[list[tuple[str, nn.Parameter]]]:
    """Consecutive runs of ~cap_bytes (DDP's rule: a bucket closes once it reaches the cap)."""
    groups: list[list[tuple[str, nn.Parameter]]] = [[]]
    size = 0
    for name, p in named:
        if size >= cap_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += p.numel() * p.element_size()
    return groups


class ShardOptimizer:
    """Adam over the slices this rank owns (fp32: in place; bf16-mixed: on fp32 master copies)."""

    def __init__(self, shards: list[torch.Tensor], precision: str) -> None:
        self.shards, self.precision = shards, precision
        if precision == "fp32":
            # nn.Parameter(view) aliases the slice: the step updates the flat buffer in place
            self.master = [nn.Parameter(s, requires_grad=True) for s in shards]
        else:
            self.master = [nn.Parameter(s.detach().float().clone()) for s in shards]
        self.optimizer = make_optimizer(self.master)

    def master_copies(self) -> list[torch.Tensor]:
        """Tensors that are optimizer state beyond ``optimizer.state`` (the fp32 master, bf16 only)."""
        return [] if self.precision == "fp32" else list(self.master)

    def step(self, grad_shards: list[torch.Tensor]) -> None:
        """Adam on the owned slices, from the reduced gradient slices; bf16 slices rewritten."""
        for m, g in zip(self.master, grad_shards):
            m.grad = g if g.dtype == m.dtype else g.float()
        self.optimizer.step()
        with torch.no_grad():
            for m, s in zip(self.master, self.shards):
                if self.precision != "fp32":
                    s.copy_(m)
                m.grad = None


class UnitActivationMeter(ActivationMeter):
    """ActivationMeter for ZeRO-3: gathered parameters come and go, so a saved tensor is skipped
    when its storage is one of the units' gathered buffers at the moment it is saved (``buffers``:
    every unit's flat buffer; a freed one has no memory, hence no address, and the allocator may
    hand its old address to an activation later)."""

    def __init__(self, buffers: Callable[[], Iterable[torch.Tensor]]) -> None:
        super().__init__()
        self._buffers = buffers

    def _pack(self, t: torch.Tensor) -> Any:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if ptr and any(ptr == b.untyped_storage().data_ptr() for b in self._buffers()):
                return t  # gathered weights are model states, not activations
        return super()._pack(t)
