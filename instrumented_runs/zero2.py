"""ZeRO stage 2: optimizer state and gradients partitioned (P_os+g; Rajbhandari et al., arXiv:1910.02054).

Idea. ZeRO-1 (zero1.py) updates only this rank's 1/N slice of the parameters, yet it still keeps
the *full* gradient until the step, although the optimizer reads only the slice. ZeRO-2 reduces
the gradients as backward produces them and keeps only the reduced slice:

    for each bucket b, as soon as backward has produced all of its gradients:
        g_b[r]  = reduce_scatter(g_b)[r]           async, overlapping the rest of backward
        free g_b                                    the full bucket gradient is gone
    w_b[r] <- Adam(w_b[r], g_b[r])                  for every bucket: the owned slice only
    w_b     = all_gather(w_b[0] .. w_b[N-1])        the updated parameters back everywhere

Buckets follow DDP (dp.py): ~1 MiB of parameters each, in reverse registration order, launched
strictly in order from post-accumulate-grad hooks. Here each bucket is also the unit of
partitioning: its flat buffer is padded to a multiple of N and rank r owns slice r of *every*
bucket (FlatGroup in sharding.py), so one reduce-scatter per bucket hands each rank exactly what
it owns. The gradient a hook sees is copied into the bucket's flat buffer (allocated when the
bucket's first gradient arrives) and dropped, so at most a few buckets of full gradients exist at
any time, never the whole model's.

Memory per rank (counted from the tensors at the step boundary, never from these formulas):

    bf16-mixed (K=12)   2 Psi params + 2 Psi / N grads + 12 Psi / N = 2 Psi + 14 Psi / N
    fp32                4 Psi params + 4 Psi / N grads +  8 Psi / N = 4 Psi + 12 Psi / N

Communication per rank per step (ideal ring): reduce-scatter (N-1)/N Psi + all-gather (N-1)/N Psi
= 2 Psi (N-1)/N, as DP and ZeRO-1 (ZeRO-3: 3 Psi (N-1)/N). Gloo runs each reduce-scatter as a
full all-reduce of the bucket, so the wire carries more than the ideal (reported by the analysis).

Phases of a step: compute (forward, backward), reduce (bucketed reduce-scatter launched inside
backward), free (each full bucket gradient, once its reduce-scatter is done), update (Adam on the
owned slices), gather (all-gather of each bucket's parameters).

Trace signature. Inside ``backward``: ``comm:reduce_scatter:bucket<i>`` launches in order
bucket0, bucket1, ... with ``gloo:all_reduce`` spans of the full bucket on a ``pt_gloo_runloop``
thread overlapping the rest of backward; then ``comm:wait:bucket<i>``, ``optimizer`` and one
``comm:all_gather:bucket<i>`` (``gloo:all_gather`` of one slice per rank) per bucket.

Run: ``torchrun --nproc-per-node 2 -m instrumented_runs.zero2`` or ``tracekit run zero2``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from instrumented_runs import harness
from instrumented_runs.c10d import all_gather_single, grad_of, reduce_scatter_single, wait
from instrumented_runs.model import GPT
from instrumented_runs.sharding import FlatGroup, ShardOptimizer, split_into_buckets
from tracekit import labels
from tracekit.capture import ActivationMeter, region

BUCKET_CAP_BYTES = 1 << 20  # as dp.py: a handful of buckets on our 3.5 MB model


@dataclass
class Bucket:
    layout: FlatGroup
    grad_shard: torch.Tensor  # this rank's reduced slice: the only gradient kept
    grad_full: torch.Tensor | None = None  # the bucket's full gradient while backward fills it
    pending: int = 0
    work: dist.Work | None = field(default=None, repr=False)

    @property
    def index(self) -> int:
        return self.layout.index


# --- collectives, each inside its label --------------------------------------------------------


def reduce_scatter_bucket(bucket: Bucket, group: dist.ProcessGroup) -> dist.Work:
    """Launch the asynchronous sum of one bucket's gradient; this rank receives its slice."""
    with region(labels.comm("reduce_scatter", labels.bucket(bucket.index))):
        return reduce_scatter_single(
            bucket.grad_shard, bucket.grad_full, op=dist.ReduceOp.SUM, group=group, async_op=True
        )


def wait_bucket(bucket: Bucket) -> None:
    with region(labels.wait_bucket(bucket.index)):
        wait(bucket.work, f"bucket {bucket.index}")
    bucket.work = None


def all_gather_bucket(
    bucket: Bucket, flat_param: torch.Tensor, rank: int, group: dist.ProcessGroup
) -> dist.Work:
    """Launch the rebuild of one bucket's parameters from every rank's updated slice (in place)."""
    with region(labels.comm("all_gather", labels.bucket(bucket.index))):
        return all_gather_single(
            flat_param, bucket.layout.shard(flat_param, rank), group=group, async_op=True
        )


# --- the strategy ------------------------------------------------------------------------------


class ZeRO2:
    """Full parameters on every rank; gradients and Adam state for this rank's slices only."""

    def __init__(
        self,
        model: nn.Module,
        precision: str,
        group: dist.ProcessGroup,
        bucket_cap_bytes: int = BUCKET_CAP_BYTES,
    ) -> None:
        self.model, self.group = model, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.bucket_cap_bytes = bucket_cap_bytes
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad][::-1]
        layouts = [
            FlatGroup(i, [p for _, p in g], [n for n, _ in g], self.world_size)
            for i, g in enumerate(split_into_buckets(named, bucket_cap_bytes))
        ]
        # each bucket's parameters become views into one flat buffer per bucket
        self.flat_params = [lay.flatten() for lay in layouts]
        for lay, flat in zip(layouts, self.flat_params):
            lay.bind_params(flat)
        self.buckets = [
            Bucket(
                lay,
                torch.zeros(lay.shard_numel, dtype=flat.dtype, device=flat.device),
                pending=len(lay.params),
            )
            for lay, flat in zip(layouts, self.flat_params)
        ]
        self.param_shards = [
            b.layout.shard(flat, self.rank) for b, flat in zip(self.buckets, self.flat_params)
        ]
        self.opt = ShardOptimizer(self.param_shards, precision)
        self.next_bucket = 0
        for bucket in self.buckets:
            for p, offset in zip(bucket.layout.params, bucket.layout.offsets):
                p.register_post_accumulate_grad_hook(self._grad_ready_hook(bucket, offset))

    def describe(self) -> list[dict]:
        return [b.layout.describe() for b in self.buckets]

    def _grad_ready_hook(self, bucket: Bucket, offset: int) -> Callable[[nn.Parameter], None]:
        def hook(param: nn.Parameter) -> None:
            if bucket.grad_full is None:  # first gradient of the bucket this step
                bucket.grad_full = torch.zeros(
                    bucket.layout.padded, dtype=param.dtype, device=param.device
                )
            bucket.grad_full[offset : offset + param.numel()].copy_(grad_of(param).reshape(-1))
            param.grad = None  # the parameter's own gradient is dropped at once
            bucket.pending -= 1
            if bucket.pending == 0:
                self._launch_ready_buckets()

        return hook

    def _launch_ready_buckets(self) -> None:
        # phase: reduce, strictly in bucket order so every rank issues the same sequence
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            bucket = self.buckets[self.next_bucket]
            if bucket.grad_full is None:
                raise RuntimeError(f"bucket {bucket.index} reduced before any gradient arrived")
            bucket.grad_full.div_(self.world_size)
            bucket.work = reduce_scatter_bucket(bucket, self.group)
            self.next_bucket += 1

    def wait_and_free(self) -> None:
        if self.next_bucket != len(self.buckets):
            raise RuntimeError(
                f"bucket {self.next_bucket} never filled: every parameter must get a gradient"
            )
        for bucket in self.buckets:
            wait_bucket(bucket)
            bucket.grad_full = None  # phase: free, only the reduced slice stays
            bucket.pending = len(bucket.layout.params)
        self.next_bucket = 0

    def gather_params(self) -> None:
        works = [
            all_gather_bucket(b, flat, self.rank, self.group)
            for b, flat in zip(self.buckets, self.flat_params)
        ]
        for bucket, work in zip(self.buckets, works):
            with region(labels.wait(labels.bucket(bucket.index), "params")):
                work.wait()

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """One step; returns this rank's local loss."""
        with region(labels.STEP):
            # phase: compute; hooks reduce-scatter each bucket as soon as it fills (overlap)
            with region(labels.FORWARD):
                loss = self.model(tokens, targets)
            with region(labels.BACKWARD):
                loss.backward()
            self.wait_and_free()
            # phase: update, Adam on the owned slices (bf16-mixed: on their fp32 master copies)
            with region(labels.OPTIMIZER):
                self.opt.step([b.grad_shard for b in self.buckets])
            # phase: gather, the updated slices back into every bucket's full parameters
            self.gather_params()
        return loss.item()


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("zero2", argv)
    model = GPT(ctx.model_config, seed=ctx.args.seed).to(
        ctx.device
    )  # same seed: same weights everywhere
    if ctx.args.precision == "bf16-mixed":
        model.to(torch.bfloat16)
    zero = ZeRO2(model, ctx.args.precision, ctx.group)
    ctx.strategy_options.update(
        zero_stage=2,
        dp_degree=zero.world_size,
        bucket_cap_bytes=zero.bucket_cap_bytes,
        buckets=zero.describe(),
    )
    ctx.meter_activations(ActivationMeter(exclude=zero.flat_params))
    ctx.count_memory_at(
        zero.opt.optimizer,
        lambda: dict(
            params=zero.flat_params,
            grads=[*(b.grad_shard for b in zero.buckets), *(p.grad for p in model.parameters())],
            optimizer=zero.opt.optimizer,
            extra_optimizer=zero.opt.master_copies(),
        ),
    )
    harness.run(ctx, zero.train_step, model.state_dict, (zero.rank, zero.world_size))


if __name__ == "__main__":
    harness.entrypoint(main)
