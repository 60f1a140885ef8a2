"""ZeRO stage 1: optimizer state partitioned (P_os; Rajbhandari et al., arXiv:1910.02054).

Idea. Plain data parallelism keeps the whole Adam state (and, under mixed precision, the fp32
master weights) on every one of the N ranks, although each rank could update any 1/N of the
parameters by itself. ZeRO-1 cuts the flat parameter vector into N contiguous slices; rank r keeps
the optimizer state of slice r only and updates only that slice:

    g      = (1/N) sum_r g_r                          every rank computes full local gradients
    g[r]   = reduce_scatter(g_0 .. g_{N-1})[r]        ... but needs the sum over its slice only
    w[r]  <- Adam(w[r], g[r])                          the step on 1/N of the parameters
    w      = all_gather(w[0] .. w[N-1])               everyone gets the updated parameters back

The result equals data-parallel (and single-process) training exactly: Adam is elementwise, so
updating the slices separately is the same arithmetic as updating the whole.

Memory per rank (Psi parameters; the memory is counted from the tensors at the step boundary,
never from these formulas):

    bf16-mixed (K=12)   2 Psi params + 2 Psi grads + 12 Psi / N (fp32 master + 2 moments)
                        = 4 Psi + 12 Psi / N          (DP: 16 Psi)
    fp32                4 Psi params + 4 Psi grads + 8 Psi / N (2 moments)
                        = 8 Psi + 8 Psi / N           (DP: 16 Psi)

Communication per rank per step (ideal ring, elements): reduce-scatter (N-1)/N Psi plus all-gather
(N-1)/N Psi = 2 Psi (N-1)/N, exactly DP's all-reduce (which *is* a reduce-scatter followed by an
all-gather): the memory is saved for free. ZeRO-3 pays 3 Psi (N-1)/N.

Phases of a step: compute (forward, backward into the full flat gradient), reduce
(reduce-scatter of the gradient), update (Adam on the owned slice), gather (all-gather of the
parameters). Gloo has no native reduce-scatter: it runs a full all-reduce and keeps the slice,
so the wire carries 2 Psi (N-1)/N for the reduce alone (the analysis reports both).

Trace signature. After ``backward`` on the main thread: ``comm:reduce_scatter:grads`` (holding
``c10d::_reduce_scatter_base_``; on gloo the transfer is a ``gloo:all_reduce`` span of the whole
gradient on a ``pt_gloo_runloop`` thread), ``optimizer``, then ``comm:all_gather:params``
(``c10d::_allgather_base_``, ``gloo:all_gather`` of one slice per rank). One of each per step.

Run: ``torchrun --nproc-per-node 2 -m instrumented_runs.zero1`` or ``tracekit run zero1``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from instrumented_runs import harness
from instrumented_runs.c10d import all_gather_single, reduce_scatter_single
from instrumented_runs.model import GPT
from instrumented_runs.sharding import FlatGroup, ShardOptimizer
from tracekit import labels
from tracekit.capture import ActivationMeter, region

# --- collectives, each inside its label --------------------------------------------------------


def reduce_scatter_grads(
    flat_grad: torch.Tensor, grad_shard: torch.Tensor, group: dist.ProcessGroup
) -> None:
    """Sum the flat gradient over the group; this rank receives its slice (in place: the
    output is the input's own slice, which gloo and NCCL both allow)."""
    with region(labels.comm("reduce_scatter", "grads")):
        reduce_scatter_single(grad_shard, flat_grad, op=dist.ReduceOp.SUM, group=group)


def all_gather_params(
    flat_param: torch.Tensor, param_shard: torch.Tensor, group: dist.ProcessGroup
) -> None:
    """Rebuild the full flat parameters from every rank's updated slice (in place)."""
    with region(labels.comm("all_gather", "params")):
        all_gather_single(flat_param, param_shard, group=group)


# --- the strategy ------------------------------------------------------------------------------


class ZeRO1:
    """Full parameters and gradients on every rank; Adam state for this rank's slice only."""

    def __init__(self, model: nn.Module, precision: str, group: dist.ProcessGroup) -> None:
        self.model, self.group = model, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.layout = FlatGroup(0, [p for _, p in named], [n for n, _ in named], self.world_size)
        # the model's parameters and gradients become views into two flat buffers
        self.flat_param = self.layout.flatten()
        self.layout.bind_params(self.flat_param)
        self.flat_grad = torch.zeros_like(self.flat_param)
        for p, g in zip(self.layout.params, self.layout.views(self.flat_grad)):
            p.grad = g
        self.param_shard = self.layout.shard(self.flat_param, self.rank)
        self.grad_shard = self.layout.shard(self.flat_grad, self.rank)
        self.opt = ShardOptimizer([self.param_shard], precision)

    def describe(self) -> dict:
        return {"flat": self.layout.describe(), "shard_numel": self.layout.shard_numel}

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """One step; returns this rank's local loss."""
        with region(labels.STEP):
            with region(labels.ZERO_GRAD):
                self.flat_grad.zero_()
            # phase: compute, full forward and backward on the local slice of the batch
            with region(labels.FORWARD):
                loss = self.model(tokens, targets)
            with region(labels.BACKWARD):
                loss.backward()
            # phase: reduce, the mean gradient over this rank's slice only
            self.flat_grad.div_(self.world_size)
            reduce_scatter_grads(self.flat_grad, self.grad_shard, self.group)
            # phase: update, Adam on the owned slice (bf16-mixed: on its fp32 master copy)
            with region(labels.OPTIMIZER):
                self.opt.step([self.grad_shard])
            # phase: gather, everyone's updated slices back into the full parameters
            all_gather_params(self.flat_param, self.param_shard, self.group)
        return loss.item()


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("zero1", argv)
    model = GPT(ctx.model_config, seed=ctx.args.seed).to(
        ctx.device
    )  # same seed: same weights everywhere
    if ctx.args.precision == "bf16-mixed":
        model.to(torch.bfloat16)
    zero = ZeRO1(model, ctx.args.precision, ctx.group)
    ctx.strategy_options.update(zero_stage=1, dp_degree=zero.world_size, **zero.describe())
    ctx.meter_activations(ActivationMeter(exclude=[zero.flat_param]))
    ctx.count_memory_at(
        zero.opt.optimizer,
        lambda: dict(
            params=[zero.flat_param],
            grads=[zero.flat_grad, *(p.grad for p in model.parameters())],
            optimizer=zero.opt.optimizer,
            extra_optimizer=zero.opt.master_copies(),
        ),
    )
    harness.run(ctx, zero.train_step, model.state_dict, (zero.rank, zero.world_size))


if __name__ == "__main__":
    harness.entrypoint(main)
