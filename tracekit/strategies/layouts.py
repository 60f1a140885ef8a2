"""Which (world size, nodes) layouts a strategy can run (torch-free): checked by the launcher
before it starts anything and by the harness in every rank before it joins the process group.
Each check returns why the layout cannot run, or None."""

from __future__ import annotations

from tracekit.strategies.model_shape import GPTConfig


def pipeline_stages(world_size: int, nodes: int) -> str | None:
    """A pipeline puts one stage on each rank and at least one block on each stage."""
    blocks = GPTConfig().n_layers
    if world_size > blocks:
        return f"{world_size} pipeline stages but the model has only {blocks} blocks: use --nproc <= {blocks}"
    return None


def hsdp_mesh(world_size: int, nodes: int) -> str | None:
    """HSDP replicates across nodes and shards inside each: K >= 2 nodes of >= 2 ranks each."""
    if nodes < 2:
        return "hsdp needs --nodes K >= 2 (replicate across nodes); on one node use fsdp"
    if world_size % nodes:
        return f"hsdp: --nproc {world_size} does not divide by --nodes {nodes}"
    if world_size // nodes < 2:
        return "hsdp needs at least 2 ranks per node to shard over; with one rank per node use dp"
    return None
