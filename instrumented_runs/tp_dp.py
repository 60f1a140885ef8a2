"""Tensor parallelism inside a node, data parallelism across nodes (Megatron-LM, arXiv:1909.08053 §3).

Idea. N ranks on K nodes form a t x d grid, t = N / K ranks per node, d = K: the t ranks of a
node split every layer (``instrumented_runs.tp``: its f/g all-reduces talk inside every layer,
so they stay on the fast intra-node links), and the d nodes are data-parallel replicas of that
tensor-parallel model, each on 1/d of the global batch, averaging gradients once per step
(``instrumented_runs.dp``'s bucketed all-reduce, over the DP group) on the slow inter-node links.
Ranks are placed contiguously, rank = node x t + tp_rank:

    TP groups {0..t-1}, {t..2t-1}, ...      (one per node)
    DP groups {0, t, 2t, ...}, {1, t+1, ...} (one per TP rank: the same shard on every node)

e.g. 4 ranks on 2 nodes: TP {0,1}, {2,3}; DP {0,2}, {1,3}. A DP group holds identical shards,
so the sharded gradients are averaged shard by shard and the replicated ones as a whole.

Traffic per rank per step, L layers, local batch b = B/d: TP 4 L all-reduces of b s h elements
in the TP group (intra-node); DP all-reduces of the rank's own parameters, Psi_rep + Psi_shard/t
elements in buckets, in the DP group (inter-node). run.json ``config.strategy_options.
process_groups`` lists every group as {name, desc, dim: tp|dp, ranks}, so bytes split per
dimension.

Trace signature. ``forward``/``backward`` carry the TP labels ``comm:all_reduce:layer<i>:attn|mlp:
fwd|bwd`` (synchronous, TP group) and, inside ``backward``, the DP bucket launches
``comm:all_reduce:bucket<j>`` (asynchronous, DP group) followed by ``comm:wait:bucket<j>``; each
process group has its own gloo runloop threads, so the TP and DP ``gloo:all_reduce`` spans sit
on different threads.

Run: ``torchrun --nproc-per-node 4 -m instrumented_runs.tp_dp --nodes 2`` or
``tracekit run tp-dp --nproc 4 --nodes 2``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from instrumented_runs import harness
from instrumented_runs.dp import DataParallel
from instrumented_runs.model import GPT, memory_states, setup_precision
from instrumented_runs.tp import TensorParallelGPT, group_record
from tracekit import capture


def tp_dp_groups(
    rank: int, world: int, tp_size: int
) -> tuple[dist.ProcessGroup, dist.ProcessGroup, list[dict[str, Any]]]:
    """(this rank's TP group, its DP group, records of the groups it belongs to).

    Every rank must create every group, in the same order, members or not (c10d's rule)."""
    layout = {
        "tp": [list(range(s, s + tp_size)) for s in range(0, world, tp_size)],
        "dp": [list(range(j, world, tp_size)) for j in range(tp_size)],
    }
    mine: dict[str, dist.ProcessGroup] = {}
    for dim, blocks in layout.items():
        for i, ranks in enumerate(blocks):
            group = dist.new_group(ranks, group_desc=f"{dim}{i}")
            if rank in ranks:
                mine[dim] = group
    return mine["tp"], mine["dp"], [group_record(mine[dim], dim) for dim in ("tp", "dp")]


def all_process_groups(ctx: harness.Context, own: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's group records, deduplicated (a rank can only describe groups it is in)."""
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, own, group=ctx.meta_group)
    seen = {(g["name"], g["dim"]): g for recs in everyone for g in recs}
    return sorted(seen.values(), key=lambda g: (g["dim"] != "tp", g["ranks"]))


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("tp-dp", argv)
    cfg, nodes = ctx.model_config, ctx.args.nodes
    tp_size = ctx.world_size // nodes
    tp_group, dp_group, own = tp_dp_groups(ctx.rank, ctx.world_size, tp_size)
    # phase: build the node's tensor-parallel model, then wrap it in data parallelism over nodes
    model = TensorParallelGPT(GPT(cfg, seed=ctx.args.seed), tp_group).to(ctx.device)
    optimizer, master = setup_precision(model, ctx.args.precision)
    dp = DataParallel(model, master or optimizer, dp_group)
    dp_rank, dp_size = dist.get_rank(dp_group), dist.get_world_size(dp_group)
    split = model.param_split()
    ctx.strategy_options.update(
        tp_size=tp_size,
        dp_size=dp_size,
        embeddings="replicated",
        **split,
        psi_sharded=split["psi_sharded_local"] * tp_size,
        all_reduces_per_layer={"forward": 2, "backward": 2},
        activation_elements=ctx.args.global_batch // dp_size * cfg.seq_len * cfg.d_model,
        bucket_cap_bytes=dp.bucket_cap_bytes,
        buckets=dp.describe(),
        process_groups=all_process_groups(ctx, own),
    )

    # activations: the peak of the memory step; parameters (after the bf16 cast) are not ones
    ctx.meter_activations(capture.ActivationMeter(exclude=model.parameters()), per_step=True)
    ctx.count_memory_at(optimizer, lambda: memory_states(model, optimizer, master))
    # one slice per node, the whole slice on every TP rank of the node
    harness.run(ctx, dp.train_step, model.state_dict, (dp_rank, dp_size))


if __name__ == "__main__":
    harness.entrypoint(main)
