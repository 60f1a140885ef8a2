"""Data parallelism with bucketed, overlapped gradient all-reduce (PyTorch DDP, arXiv:2006.15704).

Idea. Every one of the n ranks keeps a full replica of the model and the optimizer and trains on
its own 1/n slice of the global batch. Because the loss is a mean over the batch, the global
gradient is the mean of the local ones,

    g = (1/n) * sum_r g_r,

so after one all-reduce of the gradients every replica applies the same update and the replicas
stay identical: the result equals single-process training on the whole batch.

Bucketing and overlap (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020). One all-reduce per parameter pays the per-call latency hundreds of times;
one all-reduce of everything cannot start before backward ends. DDP packs the gradients into flat
buckets of about ``bucket_cap`` bytes, in *reverse* order of registration (backward produces the
last layers' gradients first), and launches a bucket's all-reduce asynchronously the moment its
last gradient is accumulated, so communication of late layers overlaps the backward of early
layers. Buckets are launched strictly in index order so every rank issues the same sequence of
collectives. The gradients are views into the bucket buffers (``gradient_as_bucket_view``), so
they take no memory beyond the buckets. Here a post-accumulate-grad hook on each parameter counts
the bucket down and launches it; before ``optimizer.step()`` each bucket is waited for.

Cost. A ring all-reduce of Psi elements sends (and receives) 2 (n-1)/n x Psi elements per rank
(reduce-scatter then all-gather, each (n-1)/n x Psi), whatever the bucketing: bucketing changes
latency and overlap, not volume. Model states per rank: 16 Psi bytes with Adam, the same on every
rank, the redundancy ZeRO removes: fp32 4 params + 4 grads + 8 moments; bf16-mixed 2 params +
2 grads + 12 (fp32 master + 2 moments, ZeRO's K=12), with bf16 gradients on the wire (half the bytes).

Trace signature. Inside ``backward``, on the main thread, short ``comm:all_reduce:bucket<i>``
spans (each holding the ``c10d::allreduce_`` launch) in order bucket0, bucket1, ...; on a
``pt_gloo_runloop`` thread the matching ``gloo:all_reduce`` spans, which overlap the rest of
``backward``; then ``comm:wait:bucket<i>`` spans (short if overlap hid the transfer) and the
``optimizer`` phase. One all-reduce per bucket per step, each of the bucket's size.

Run: ``torchrun --nproc-per-node 2 -m instrumented_runs.dp`` or ``tracekit run dp``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from instrumented_runs import harness
from instrumented_runs.c10d import started, wait
from instrumented_runs.model import GPT, MasterWeights, memory_states, setup_precision
from tracekit import labels
from tracekit.capture import region

# DDP's default is 25 MiB; our model is 3.5 MB, so 1 MiB gives a handful of buckets to see.
BUCKET_CAP_BYTES = 1 << 20


@dataclass
class Bucket:
    index: int
    params: list[nn.Parameter]
    names: list[str]
    buffer: torch.Tensor  # flat gradients; every param.grad is a view into it
    pending: int = 0  # gradients not yet accumulated this step
    work: dist.Work | None = field(default=None, repr=False)


# --- collectives, each inside its label --------------------------------------------------------


def broadcast_params(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Start from rank 0's weights (DDP does this at construction)."""
    src = dist.get_global_rank(group, 0)
    with region(labels.comm("broadcast", "params")), torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=src, group=group)


def all_reduce_bucket(bucket: Bucket, group: dist.ProcessGroup) -> dist.Work:
    """Launch the asynchronous sum of one bucket over the group."""
    with region(labels.all_reduce_bucket(bucket.index)):
        return started(
            dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, group=group, async_op=True)
        )


def wait_bucket(bucket: Bucket) -> None:
    """Block until the bucket's all-reduce is done."""
    with region(labels.wait_bucket(bucket.index)):
        wait(bucket.work, f"bucket {bucket.index}")
    bucket.work = None


# --- the strategy ------------------------------------------------------------------------------


class DataParallel:
    """A replica of the model whose gradients are averaged across ``group`` in buckets."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | MasterWeights,
        group: dist.ProcessGroup,
        bucket_cap_bytes: int = BUCKET_CAP_BYTES,
    ) -> None:
        self.model, self.optimizer, self.group = model, optimizer, group
        self.world_size = dist.get_world_size(group)
        self.bucket_cap_bytes = bucket_cap_bytes
        self.buckets = self._build_buckets()
        self.next_bucket = 0  # DDP launches buckets strictly in order
        broadcast_params(model, group)
        for bucket in self.buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(self._grad_ready_hook(bucket))

    def _build_buckets(self) -> list[Bucket]:
        """Reverse registration order, ~bucket_cap bytes each; grads become views of the buffers."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad][::-1]
        groups: list[list[tuple[str, nn.Parameter]]] = [[]]
        size = 0
        for name, p in named:
            if size >= self.bucket_cap_bytes:
                groups.append([])
                size = 0
            groups[-1].append((name, p))
            size += p.numel() * p.element_size()
        buckets = []
        for i, members in enumerate(groups):
            params = [p for _, p in members]
            buffer = torch.zeros(
                sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
            )
            offset = 0
            for p in params:
                p.grad = buffer[offset : offset + p.numel()].view_as(p)  # gradient_as_bucket_view
                offset += p.numel()
            buckets.append(Bucket(i, params, [n for n, _ in members], buffer, pending=len(params)))
        return buckets

    def describe(self) -> list[dict]:
        return [
            {
                "index": b.index,
                "numel": b.buffer.numel(),
                "bytes": b.buffer.numel() * b.buffer.element_size(),
                "params": b.names,
            }
            for b in self.buckets
        ]

    def _grad_ready_hook(self, bucket: Bucket) -> Callable[[nn.Parameter], None]:
        def hook(param: nn.Parameter) -> None:
            bucket.pending -= 1
            if bucket.pending == 0:
                self._launch_ready_buckets()

        return hook

    def _launch_ready_buckets(self) -> None:
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            bucket = self.buckets[self.next_bucket]
            bucket.buffer.div_(self.world_size)  # pre-divide, as DDP's default hook
            bucket.work = all_reduce_bucket(bucket, self.group)
            self.next_bucket += 1

    def zero_grad(self) -> None:
        """Zero the bucket buffers in place (set_to_none would break the gradient views)."""
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.pending = len(bucket.params)
        self.next_bucket = 0

    def wait_all(self) -> None:
        if self.next_bucket != len(self.buckets):
            stuck = self.buckets[self.next_bucket]
            raise RuntimeError(
                f"bucket {stuck.index} never filled: every parameter must get a gradient"
            )
        for bucket in self.buckets:
            wait_bucket(bucket)

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """One step; returns this rank's local loss."""
        with region(labels.STEP):
            with region(labels.ZERO_GRAD):
                self.zero_grad()
            # phase: forward on the local slice of the batch
            with region(labels.FORWARD):
                loss = self.model(tokens, targets)
            # phase: backward; hooks launch each bucket's all-reduce as soon as it fills (overlap)
            with region(labels.BACKWARD):
                loss.backward()
            # phase: wait for the averaged gradients
            self.wait_all()
            # phase: identical update on every replica (bf16-mixed: on the fp32 master copy)
            with region(labels.OPTIMIZER):
                self.optimizer.step()
        return loss.item()


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("dp", argv)
    model = GPT(ctx.model_config, seed=ctx.args.seed).to(ctx.device)
    optimizer, master = setup_precision(
        model, ctx.args.precision
    )  # bf16-mixed: bf16 model, fp32 master
    dp = DataParallel(model, master or optimizer, ctx.group)
    ctx.strategy_options.update(bucket_cap_bytes=dp.bucket_cap_bytes, buckets=dp.describe())
    ctx.count_memory_at(optimizer, lambda: memory_states(model, optimizer, master))
    shard = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
    harness.run(ctx, dp.train_step, model.state_dict, shard)


if __name__ == "__main__":
    harness.entrypoint(main)
