"""Tensor parallelism, Megatron-LM style (Shoeybi et al., arXiv:1909.08053).

Idea. Split every transformer layer's weight matrices across the t ranks of a tensor-parallel
group, so that each rank holds 1/t of them and does 1/t of the matmuls; every rank sees the
*same* batch. The MLP ``Y = GELU(X A) B`` is split with A by columns and B by rows,

    A = [A_1 ... A_t],   B = [B_1; ...; B_t],   Y = sum_i GELU(X A_i) B_i,

so GELU applies to each rank's columns locally and one sum (an all-reduce) finishes the layer.
Attention is split the same way by heads: the fused QKV projection is column-parallel (rank i
keeps the q, k and v rows of heads i*h/t .. (i+1)*h/t - 1), each rank runs its heads' attention,
and the output projection is row-parallel (one all-reduce of the partial sums).

The paper's two conjugate operators make the sums, written out below as autograd Functions:

    f: forward identity,   backward all-reduce    (before a column-parallel linear: X is
                                                    replicated, dL/dX = sum_i dL/dX_i)
    g: forward all-reduce, backward identity      (after a row-parallel linear: Y = sum_i Y_i)

Each layer is ``f -> QKV -> attention -> proj -> g`` then ``f -> fc1 -> GELU -> fc2 -> g``: two
all-reduces forward (the two g) and two backward (the two f), each of the activation's size
b x s x h. Row-parallel biases are added once, after g.

Embeddings, layer norms, the final norm and the LM head are *replicated*, not vocab-parallel:
with a 256-token vocabulary they are 9 % of Psi, and a vocab-parallel head would add its own
all-reduces (of the softmax max and sum) that would blur the per-layer signature. Replicated
parts get identical inputs and identical (full) gradients on every rank, so they need no
communication at all: the step's only collectives are the 4 L all-reduces of the layers.

Cost per step, L layers, activations of b x s x h elements: 4 L all-reduces (2 L forward, 2 L
backward), i.e. 4 L x 2(t-1)/t x b s h elements sent per rank under a ring. Model states per
rank: 16 (Psi_replicated + Psi_sharded / t) bytes with fp32 Adam (Psi_sharded = L (12 h^2 + 7 h)).

Trace signature. Inside ``forward``, per layer i, ``comm:all_reduce:layer<i>:attn:fwd`` then
``comm:all_reduce:layer<i>:mlp:fwd``, each holding one ``c10d::allreduce_`` and matched by one
``gloo:all_reduce`` span (synchronous: compute waits); inside ``backward`` the ``...:mlp:bwd``
then ``...:attn:bwd`` of layer L-1 down to 0. Per step exactly 4 L all-reduces of b s h x 4
bytes (fp32), nothing else.

Run: ``torchrun --nproc-per-node 2 -m instrumented_runs.tp`` or ``tracekit run tp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from instrumented_runs import harness
from instrumented_runs.model import (
    GPT,
    MLP,
    Block,
    CausalSelfAttention,
    GPTConfig,
    MasterWeights,
    loss_fn,
    memory_states,
    setup_precision,
)
from tracekit import capture, labels
from tracekit.capture import region

# --- collectives, each inside its label --------------------------------------------------------


def all_reduce_activation(x: torch.Tensor, group: dist.ProcessGroup, label: str) -> torch.Tensor:
    """Sum ``x`` in place over the tensor-parallel group."""
    with region(label):
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


class CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, label: str) -> torch.Tensor:
        ctx.group, ctx.label = group, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        # a copy: autograd may hand the same gradient tensor to other consumers
        grad = grad.clone(memory_format=torch.contiguous_format)
        return all_reduce_activation(grad, ctx.group, ctx.label), None, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, label: str) -> torch.Tensor:
        # x is a fresh matmul output that nothing saved for backward: sum it in place
        return all_reduce_activation(x.contiguous(), group, label)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


# --- sharding the single-process model's weights ------------------------------------------------


def shard_rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Output features of a column-parallel linear (torch stores weights as (out, in))."""
    return t.chunk(world, dim=0)[rank]


def shard_cols(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Input features of a row-parallel linear."""
    return t.chunk(world, dim=1)[rank]


def shard_qkv(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Fused [q; k; v] rows -> [q_i; k_i; v_i] of this rank's heads (heads are contiguous rows)."""
    return torch.cat([shard_rows(z, rank, world) for z in t.chunk(3, dim=0)])


#: parameter name suffix -> how it is split ("replicated" for every other parameter)
SHARDING = {
    "attn.qkv.weight": "qkv",
    "attn.qkv.bias": "qkv",
    "attn.proj.weight": "cols",
    "mlp.fc.weight": "rows",
    "mlp.fc.bias": "rows",
    "mlp.out.weight": "cols",
}


def sharding_of(name: str) -> str:
    return next((kind for suffix, kind in SHARDING.items() if name.endswith(suffix)), "replicated")


_SHARD = {"rows": shard_rows, "cols": shard_cols, "qkv": shard_qkv}


def shard_param(name: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's part of a single-process parameter (the whole tensor if replicated)."""
    kind = sharding_of(name)
    return t if kind == "replicated" else _SHARD[kind](t, rank, world)


def full_state_dict(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Rank-ordered TP state dicts -> the single-process state dict (tests compare it)."""
    out = {}
    for name, first in shards[0].items():
        parts, kind = [s[name] for s in shards], sharding_of(name)
        if kind == "rows":
            out[name] = torch.cat(parts, dim=0)
        elif kind == "cols":
            out[name] = torch.cat(parts, dim=1)
        elif kind == "qkv":
            out[name] = torch.cat(
                [torch.cat([p.chunk(3, dim=0)[z] for p in parts]) for z in range(3)]
            )
        else:
            out[name] = first
    return out


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone())


# --- the tensor-parallel layers -----------------------------------------------------------------


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i + b_i: this rank's output features (no communication)."""

    def __init__(
        self, full: nn.Linear, rank: int, world: int, shard: Callable = shard_rows
    ) -> None:
        super().__init__()
        self.weight, self.bias = (
            _param(shard(full.weight, rank, world)),
            _param(shard(full.bias, rank, world)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = g(sum_i X_i B_i) + b: partial products summed by ``g``, the replicated bias added once."""

    def __init__(
        self, full: nn.Linear, rank: int, world: int, group: dist.ProcessGroup, label: str
    ) -> None:
        super().__init__()
        self.weight, self.bias = _param(shard_cols(full.weight, rank, world)), _param(full.bias)
        self.group, self.label = group, label

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReduceFromTP.apply(F.linear(x, self.weight), self.group, self.label) + self.bias


class ParallelAttention(nn.Module):
    """f -> column-parallel fused QKV (h/t heads) -> causal attention -> row-parallel proj -> g."""

    def __init__(
        self,
        full: CausalSelfAttention,
        cfg: GPTConfig,
        layer: int,
        rank: int,
        world: int,
        group: dist.ProcessGroup,
    ) -> None:
        super().__init__()
        if cfg.n_heads % world:
            raise ValueError(f"{cfg.n_heads} heads do not split over {world} tensor-parallel ranks")
        self.heads, self.group = cfg.n_heads // world, group
        self.bwd_label = labels.tp_all_reduce(layer, "attn", labels.BWD)
        self.qkv = ColumnParallelLinear(full.qkv, rank, world, shard_qkv)
        self.proj = RowParallelLinear(
            full.proj, rank, world, group, labels.tp_all_reduce(layer, "attn", labels.FWD)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToTP.apply(x, self.group, self.bwd_label)
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class ParallelMLP(nn.Module):
    """f -> column-parallel fc1 -> GELU (local) -> row-parallel fc2 -> g."""

    def __init__(
        self, full: MLP, layer: int, rank: int, world: int, group: dist.ProcessGroup
    ) -> None:
        super().__init__()
        self.group, self.bwd_label = group, labels.tp_all_reduce(layer, "mlp", labels.BWD)
        self.fc = ColumnParallelLinear(full.fc, rank, world)
        self.out = RowParallelLinear(
            full.out, rank, world, group, labels.tp_all_reduce(layer, "mlp", labels.FWD)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(CopyToTP.apply(x, self.group, self.bwd_label))))


class ParallelBlock(nn.Module):
    def __init__(
        self,
        full: Block,
        cfg: GPTConfig,
        layer: int,
        rank: int,
        world: int,
        group: dist.ProcessGroup,
    ) -> None:
        super().__init__()
        self.ln1, self.ln2 = full.ln1, full.ln2  # replicated
        self.attn = ParallelAttention(full.attn, cfg, layer, rank, world, group)
        self.mlp = ParallelMLP(full.mlp, layer, rank, world, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TensorParallelGPT(nn.Module):
    """The shared GPT with every block split over ``group``; embeddings, norms and head replicated.
    Parameter names are the single-process model's, so :func:`full_state_dict` can reassemble it."""

    def __init__(self, full: GPT, group: dist.ProcessGroup) -> None:
        super().__init__()
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        self.cfg = full.cfg
        self.tok_emb, self.pos_emb, self.ln_f, self.head = (
            full.tok_emb,
            full.pos_emb,
            full.ln_f,
            full.head,
        )
        self.blocks = nn.ModuleList(
            ParallelBlock(cast(Block, b), full.cfg, i, rank, world, group)
            for i, b in enumerate(full.blocks)
        )

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return loss_fn(self.head(self.ln_f(x)), targets)

    def param_split(self) -> dict[str, int]:
        """Elements this rank holds: replicated and sharded (psi_sharded_full = sharded x t)."""
        rep = sum(p.numel() for n, p in self.named_parameters() if sharding_of(n) == "replicated")
        return {
            "psi_replicated": rep,
            "psi_sharded_local": sum(p.numel() for p in self.parameters()) - rep,
        }


# --- the strategy ------------------------------------------------------------------------------


class TensorParallel:
    """One tensor-parallel replica: every rank runs the same batch through its slice of each layer."""

    def __init__(
        self, model: TensorParallelGPT, optimizer: torch.optim.Optimizer | MasterWeights
    ) -> None:
        self.model, self.optimizer = model, optimizer

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        with region(labels.STEP):
            with region(labels.ZERO_GRAD):
                self.model.zero_grad(set_to_none=True)
            # phase: forward; per layer g sums attention, then MLP partial outputs (2 all-reduces)
            with region(labels.FORWARD):
                loss = self.model(tokens, targets)
            # phase: backward; per layer f sums the gradient into MLP, then attention (2 all-reduces)
            with region(labels.BACKWARD):
                loss.backward()
            # phase: local update; shards are independent, replicated parts stay identical
            with region(labels.OPTIMIZER):
                self.optimizer.step()
        return loss.item()


def group_record(group: dist.ProcessGroup, dim: str) -> dict[str, Any]:
    """run.json ``process_groups`` entry; name and desc are the flight recorder's ``process_group``."""
    return {
        "name": group.group_name,
        "desc": group.group_desc,
        "dim": dim,
        "ranks": dist.get_process_group_ranks(group),
    }


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("tp", argv)
    cfg, t = ctx.model_config, dist.get_world_size(ctx.group)
    model = TensorParallelGPT(GPT(cfg, seed=ctx.args.seed), ctx.group).to(ctx.device)
    optimizer, master = setup_precision(model, ctx.args.precision)
    tp = TensorParallel(model, master or optimizer)
    split = model.param_split()
    ctx.strategy_options.update(
        tp_size=t,
        embeddings="replicated",
        **split,
        psi_sharded=split["psi_sharded_local"] * t,
        all_reduces_per_layer={"forward": 2, "backward": 2},
        activation_elements=ctx.args.global_batch * cfg.seq_len * cfg.d_model,
        process_groups=[group_record(ctx.group, "tp")],
    )

    # activations: the peak of the memory step; parameters (after the bf16 cast) are not ones
    ctx.meter_activations(capture.ActivationMeter(exclude=model.parameters()), per_step=True)
    ctx.count_memory_at(optimizer, lambda: memory_states(model, optimizer, master))
    harness.run(ctx, tp.train_step, model.state_dict)  # every TP rank sees the whole batch


if __name__ == "__main__":
    harness.entrypoint(main)
