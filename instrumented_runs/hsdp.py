"""Hybrid sharded data parallelism (HSDP): FSDP2 on a 2-D mesh, shard inside a node, replicate across.

Idea. ZeRO-3/FSDP (arXiv:1910.02054, arXiv:2304.11277) over all N ranks puts every per-unit
all-gather and reduce-scatter on the slow inter-node links. HSDP (FSDP paper, "hybrid
sharding") arranges the N = K x S ranks of K nodes in a (replicate=K, shard=S) device mesh:

    shard groups      the S ranks of one node: ZeRO-3 among them (all-gather params per unit,
                      reduce-scatter grads), fast intra-node links
    replicate groups  the K ranks holding the same shard, one per node: plain data parallelism,
                      one all-reduce of each unit's gradient *shard* per step across nodes

Ranks are placed contiguously (node k holds ranks kS .. kS+S-1), and ``init_device_mesh`` lays
the mesh out row-major, so on 2 nodes x 2 ranks the shard groups are {0,1}, {2,3} and the
replicate groups {0,2}, {1,3}.

Memory per rank: the ZeRO-3 formula with the *shard* group's size, 16 Psi / S (not / N): every
node keeps a whole copy of the model states, spread over its S ranks.
Communication per rank per step (ideal rings, elements): 3 Psi (S-1)/S inside the node, plus the
replicate all-reduce of the shard, 2 (Psi/S)(K-1)/K across nodes: inter-node traffic falls by S
against FSDP over all N ranks.

Per unit, in backward, FSDP2 runs ``foreach_reduce``: the reduce-scatter over the shard group,
then ``dist.all_reduce`` of the reduced shard over the replicate group (both inside
``FSDP::post_backward_reduce (<fqn>)``); each averages, so the result is the mean over all N.
Labels are FSDP2's, as in :mod:`instrumented_runs.fsdp`.

Groups in the trace. On gloo nothing on a ``gloo:*`` span names its group, but every process group
has its own ``pt_gloo_runloop`` threads. run.json ``strategy_options.process_groups`` lists every
group of the mesh: ``{name, desc, dim: "shard" | "replicate", ranks}``, ``name`` being c10d's
group name as in the flight recorder's ``process_group`` and the trace's ``distributedInfo``.

Options: ``--nodes K`` (K >= 2) and at least 2 ranks per node (a shard group of one is plain DP).
Run: ``tracekit run hsdp --nproc 4 --nodes 2``.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from instrumented_runs import fsdp, harness


def hybrid_mesh(device_type: str, nodes: int, world_size: int) -> DeviceMesh:
    """(replicate = nodes, shard = ranks per node): row k of the mesh is node k's ranks."""
    return init_device_mesh(
        device_type, (nodes, world_size // nodes), mesh_dim_names=("replicate", "shard")
    )


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("hsdp", argv)  # a bad layout: refused there (tracekit.strategies.layouts)
    mesh = hybrid_mesh(ctx.device.type, ctx.args.nodes, ctx.world_size)
    ctx.strategy_options.update(shard_size=mesh.size(1), replicate_size=mesh.size(0))
    fsdp.run(ctx, mesh, ctx.rank, ctx.world_size)  # every rank trains on its own slice


if __name__ == "__main__":
    harness.entrypoint(main)
