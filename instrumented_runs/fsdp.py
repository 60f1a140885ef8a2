"""Fully sharded data parallelism with PyTorch's own FSDP2 (``fully_shard``): ZeRO-3 in production.

Papers. ZeRO (Rajbhandari et al., arXiv:1910.02054) stage 3 partitions parameters, gradients and
optimizer state over the N data-parallel ranks; PyTorch FSDP (Zhao et al., arXiv:2304.11277) is
its production form. Model states per rank, Adam, Psi parameters::

    ZeRO-3 = 16 Psi / N        (fp32: 4 params + 4 grads + 8 moments; bf16-mixed: 2 + 2 + 12)

Mapping onto ZeRO-3. ``fully_shard(block)`` makes each transformer block one *unit* (ZeRO's
layer, FSDP's "FSDP unit"); ``fully_shard(model)`` last makes the root unit of what is left
(token/position embeddings, final LayerNorm, head). Each parameter becomes a DTensor sharded on
dim 0 (``Shard(0)``): rank r keeps rows [r*ceil(d0/N), (r+1)*ceil(d0/N)) of every tensor, so the
sharded parameters, their gradients and Adam's moments (created on the shards) are all 1/N.
For each unit and step:

    forward   gather: all-gather the unit's shards (one flat all-gather per unit)
              compute the unit's forward, then free the unsharded parameters (reshard)
    backward  gather again, compute the unit's backward, free
              reduce: reduce-scatter the unit's gradients (mean over ranks), keep the own shard
    optimizer Adam on the local shards only (no communication)

so each rank sends 3 Psi (n-1)/n elements per step (2 all-gathers + 1 reduce-scatter) against DP's
2 Psi (n-1)/n: ZeRO-3's 1.5x. The root unit is an exception: FSDP2 does not reshard the root after
forward (backward starts with it), so it is gathered once per step, not twice.
Every rank builds the same GPT from the same seed, so the shards start consistent without a broadcast.

Precision. ``fp32``: the sharded fp32 parameters are what Adam updates. ``bf16-mixed``:
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``: the fp32 shard is cast to bf16
before the all-gather (bf16 on the wire, bf16 compute), gradients are reduce-scattered in bf16
and cast back to fp32 onto the shard, and Adam updates the fp32 shard: that shard *is* the fp32
master of ZeRO's K=12 (4 master + 8 moments). Counted at the step boundary (all units resharded)::

    fp32        params 4 Psi/N (fp32 shards)       grads 4 Psi/N   optimizer 8 Psi/N (moments)
    bf16-mixed  params 0 (no bf16 copy at rest)    grads 4 Psi/N   optimizer 12 Psi/N (4 master + 8)
                (fp32: FSDP2 casts the reduced grad back to the shard's dtype)

Both total 16 Psi/N. Against the paper's bf16 split (2 + 2 + 12) FSDP2 keeps no low-precision
parameter shard (it casts on the fly at each all-gather) and holds fp32 instead of bf16 gradient
shards: same total, different parts.

Prefetch (``--prefetch 0|1|2``, default 1). On GPU, FSDP2 overlaps implicitly: all-gathers run on
their own CUDA stream. On CPU there are no streams, and FSDP2's default all-gather is synchronous
(``async_op=False``): the compute thread blocks in every all-gather. Hence:

    0   FSDP2's defaults: synchronous all-gathers; its implicit backward prefetch of the previous
        unit still runs, but blocks at once (it only moves the all-gather earlier). No overlap.
    k   asynchronous all-gathers (``_set_unshard_async_op(True)``) with explicit prefetch:
        ``set_modules_to_forward_prefetch`` (unit i, after its own all-gather, launches units
        i+1..i+k) and ``set_modules_to_backward_prefetch`` (units i-1..i-k). The gloo transfer of
        the next unit runs on a ``pt_gloo_runloop`` thread while this unit computes.

Reduce-scatters are synchronous in FSDP2 on CPU whatever the prefetch: they are never overlapped
here (on GPU they run on their own stream).

Trace signature (torch 2.13, FSDP2's ``record_function`` names; ``<fqn>`` is the unit's module
path, ``blocks.<i>``, and the root unit has no suffix at all)::

    FSDP::root_pre_forward                    start of forward on the root
    FSDP::pre_forward (<fqn>)                 holds the unit's all-gather unless prefetched
      FSDP::all_gather (<fqn>)                copy-in + ``c10d::_allgather_base_`` (+ gloo:all_gather)
      FSDP::all_gather_copy_out (<fqn>)       wait for it and split into the parameters
    FSDP::forward_prefetch for <fqn>          (prefetch >= 1) holds the next units' all-gathers
    FSDP::post_forward (<fqn>)                reshard (free) after the unit's forward
    FSDP::pre_backward (<fqn>)                all-gather again for backward ...
    FSDP::backward_prefetch for <fqn>         ... or earlier, by the unit after it
    FSDP::post_backward_accumulate (<fqn>) / FSDP::post_backward_reshard (<fqn>)
    FSDP::post_backward_reduce (<fqn>)        holds ``c10d::_reduce_scatter_base_``: the gradient
                                              reduce-scatter (gloo runs it as gloo:all_reduce over
                                              the whole flat input), HSDP adds ``c10d::allreduce_``
    FSDP::post_backward_rs_wait (<fqn>)       recycling reduce-scatter buffers (root: "()")
    FSDP::root_post_backward_callback         end of backward

There is no label with "reduce_scatter" in its name: FSDP2's reduce-scatter is the
``c10d::_reduce_scatter_base_`` inside ``FSDP::post_backward_reduce``. Our own phase labels
(step, forward, backward, optimizer, zero_grad) wrap FSDP2's. run.json ``strategy_options.units``
maps unit index -> fqn (unit i = ``blocks.<i>``, the last unit the root), with sizes.

Run: ``torchrun --nproc-per-node 2 -m instrumented_runs.fsdp`` or ``tracekit run fsdp``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from instrumented_runs import harness
from instrumented_runs.model import GPT, make_optimizer
from tracekit import capture, labels
from tracekit.capture import region

DEFAULT_PREFETCH = 1  # the CLI's default (docs/cli.md)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor parameter, the tensor itself otherwise (no autograd op:
    it runs inside saved-tensor hooks)."""
    return t._local_tensor if isinstance(t, DTensor) else t


# --- setup: sharding, precision, prefetch ------------------------------------------------------


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """fp32: no casts; bf16-mixed: bf16 all-gather/compute/reduce, fp32 sharded master weights."""
    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    return MixedPrecisionPolicy()


def shard_model(model: GPT, mesh: DeviceMesh, precision: str) -> list[FSDPModule]:
    """One FSDP unit per block, then the root; the units in forward order (root last)."""
    mp = mixed_precision(precision)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return [*model.blocks, model]


def set_prefetch(model: GPT, depth: int) -> None:
    """``--prefetch depth``: 0 keeps FSDP2's synchronous CPU default; k >= 1 makes all-gathers
    asynchronous and each unit prefetch the next k (forward) / previous k (backward) blocks."""
    if depth == 0:
        return
    # fully_shard made the model and its blocks FSDPModules (shard_model)
    root, blocks = cast(FSDPModule, model), [cast(FSDPModule, b) for b in model.blocks]
    root._set_unshard_async_op(True)  # FSDP2's switch for async all-gathers (private in 2.13)
    root.set_modules_to_forward_prefetch(blocks[:depth])  # root runs first
    root.set_modules_to_backward_prefetch(blocks[::-1][:depth])  # ... and first in backward
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + depth])
        block.set_modules_to_backward_prefetch(blocks[max(0, i - depth) : i][::-1])


def describe_units(model: GPT) -> list[dict[str, Any]]:
    """run.json ``units``: index, FSDP2's fqn and all-gather label, parameter count, local shard size."""
    fqns = [f"blocks.{i}" for i in range(len(model.blocks))] + [""]  # "": the root unit

    def unit_of(name: str) -> str:
        return ".".join(name.split(".")[:2]) if name.startswith("blocks.") else ""

    units = []
    for i, fqn in enumerate(fqns):
        own = [p for name, p in model.named_parameters() if unit_of(name) == fqn]
        units.append(
            {
                "index": i,
                "fqn": fqn,
                "label": f"FSDP::all_gather ({fqn})" if fqn else "FSDP::all_gather",
                "numel": sum(p.numel() for p in own),
                "shard_numel": sum(_local(p).numel() for p in own),
            }
        )
    return units


def process_groups(mesh: DeviceMesh, meta_group: dist.ProcessGroup) -> list[dict[str, Any]]:
    """Every process group of the mesh, from every rank: name (c10d group_name, as in the flight
    recorder's ``process_group`` and the trace's ``distributedInfo.pg_config``), desc, dim, ranks."""
    mine = []
    for dim in mesh.mesh_dim_names or ():
        pg = mesh.get_group(dim)
        mine.append(
            {
                "name": pg.group_name,
                "desc": pg.group_desc,
                "dim": dim,
                "ranks": dist.get_process_group_ranks(pg),
            }
        )
    everyone: list[Any] = [None] * dist.get_world_size(meta_group)
    dist.all_gather_object(everyone, mine, group=meta_group)
    unique = {(g["dim"], tuple(g["ranks"])): g for groups in everyone for g in groups}
    return [unique[k] for k in sorted(unique)]


class UnshardedAwareActivationMeter(capture.ActivationMeter):
    """ActivationMeter that skips FSDP2's unsharded parameters. They exist only between a unit's
    all-gather and its reshard, and their storages are reallocated every time, so they are looked
    up when a tensor is saved (autograd saves e.g. ``weight.t()`` for a Linear's backward)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def _pack(self, t: torch.Tensor) -> Any:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if any(ptr == _local(p).untyped_storage().data_ptr() for p in self.model.parameters()):
                return t
        return super()._pack(t)


# --- the strategy ------------------------------------------------------------------------------


class FullyShardedTrainer:
    """A GPT sharded with FSDP2 over ``mesh`` (1-D: FSDP; 2-D (replicate, shard): HSDP) and Adam
    on the local shards."""

    def __init__(self, model: GPT, mesh: DeviceMesh, precision: str, prefetch: int) -> None:
        self.model, self.mesh, self.precision, self.prefetch = model, mesh, precision, prefetch
        self.units = shard_model(model, mesh, precision)
        set_prefetch(model, prefetch)
        self.optimizer = make_optimizer(model.parameters())  # Adam on the DTensor shards

    def memory_states(self) -> dict[str, Any]:
        """Model states from the tensors this rank holds now (every unit resharded):
        capture.model_states' arguments. bf16-mixed: the fp32 shard is the master, no bf16 copy
        at rest."""
        shards = list(self.model.parameters())
        grads = [p.grad for p in shards]
        if self.precision == "bf16-mixed":
            return {
                "params": [],
                "grads": grads,
                "optimizer": self.optimizer,
                "extra_optimizer": shards,
            }
        return {"params": shards, "grads": grads, "optimizer": self.optimizer}

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """One step; returns this rank's local loss."""
        with region(labels.STEP):
            with region(labels.ZERO_GRAD):
                self.optimizer.zero_grad(set_to_none=True)
            # phase: forward; per unit: gather (FSDP::all_gather), compute, free (post_forward)
            with region(labels.FORWARD):
                loss = self.model(tokens, targets)
            # phase: backward; per unit in reverse: gather again, compute, free, reduce-scatter
            with region(labels.BACKWARD):
                loss.backward()
            # phase: Adam on the local shards only
            with region(labels.OPTIMIZER):
                self.optimizer.step()
        return loss.item()


def run(ctx: harness.Context, mesh: DeviceMesh, dp_rank: int, dp_size: int) -> None:
    """Train on ``mesh`` (shared by fsdp and hsdp): every rank is its own data-parallel rank."""
    prefetch = DEFAULT_PREFETCH if ctx.args.prefetch is None else ctx.args.prefetch
    model = GPT(ctx.model_config, seed=ctx.args.seed).to(ctx.device)
    trainer = FullyShardedTrainer(model, mesh, ctx.args.precision, prefetch)
    ctx.strategy_options.update(
        prefetch=prefetch,
        unshard_async_op=prefetch > 0,
        reshard_after_forward="blocks: True, root: False",
        mesh={"shape": list(mesh.shape), "dim_names": list(mesh.mesh_dim_names or ())},
        units=describe_units(model),
        process_groups=process_groups(mesh, ctx.meta_group),
        mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}
        if ctx.args.precision == "bf16-mixed"
        else None,
    )
    # activations: the peak of the memory step, without FSDP2's unsharded parameters
    ctx.meter_activations(UnshardedAwareActivationMeter(model), per_step=True)
    ctx.count_memory_at(trainer.optimizer, trainer.memory_states)
    harness.run(ctx, trainer.train_step, model.state_dict, (dp_rank, dp_size))


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("fsdp", argv)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("shard",))
    run(ctx, mesh, ctx.rank, ctx.world_size)


if __name__ == "__main__":
    harness.entrypoint(main)
