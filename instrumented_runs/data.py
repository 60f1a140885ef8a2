"""Synthetic data: a seeded, learnable token stream, identical in every process.

Each sequence is an arithmetic progression modulo the vocabulary,

    x_t = (x_0 + s * t) mod V,    x_0 ~ U{0..V-1},  s ~ U{1..8}

so the next token is predictable from the previous two: the loss falls quickly from ln V.
``global_batch(step, ...)`` draws the whole global batch of step ``step`` from a generator seeded
by (seed, step): every rank, and the single-process reference, see the same numbers without any
communication. A data-parallel rank takes its contiguous slice (:func:`rank_slice`).
"""

from __future__ import annotations

import torch

from instrumented_runs.model import GPTConfig

MAX_STRIDE = 8


def global_batch(
    step: int, cfg: GPTConfig, batch_size: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), each int64 of shape (batch_size, seq_len): targets are tokens shifted by one."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, cfg.vocab, (batch_size, 1), generator=gen)
    stride = torch.randint(1, MAX_STRIDE + 1, (batch_size, 1), generator=gen)
    t = torch.arange(cfg.seq_len + 1).unsqueeze(0)
    seq = (start + stride * t) % cfg.vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def rank_slice(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """The contiguous 1/world_size of the batch dimension that ``rank`` trains on."""
    n = batch.shape[0]
    if n % world_size:
        raise ValueError(f"global batch {n} does not divide by {world_size} data-parallel ranks")
    per = n // world_size
    return batch[rank * per : (rank + 1) * per]
