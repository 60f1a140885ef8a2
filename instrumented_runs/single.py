"""The single-process reference: the same model, seed, global batches and optimizer, one process.

Every distributed strategy must reproduce these losses and final parameters (docs/strategies.md
"Equivalence": fp32 within 1e-5 relative after 3 steps). Tests call :func:`train_single`;
``python -m instrumented_runs.single`` prints the losses.
"""

from __future__ import annotations

import argparse
import sys

import torch

from instrumented_runs.c10d import grad_of
from instrumented_runs.data import global_batch, rank_slice
from instrumented_runs.model import GPT, GPTConfig, setup_precision
from tracekit.strategies.registry import DEFAULT_GLOBAL_BATCH


def train_single(
    steps: int,
    cfg: GPTConfig | None = None,
    batch_size: int = DEFAULT_GLOBAL_BATCH,
    seed: int = 0,
    accumulate: int = 1,
    precision: str = "fp32",
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``steps`` steps (warm-up included: step k uses global batch k); (losses, final state dict).

    ``accumulate=n`` splits each global batch into n contiguous slices, backpropagates them one
    after another and divides the summed gradients by n: mathematically the full-batch step, and
    arithmetically the same as n-rank data parallelism, so parameters can be compared tightly.
    (Against the full-batch gradient, Adam's update g / (sqrt(v) + eps) turns rounding noise in
    the rare gradient element that is ~1e-8 into a visible parameter difference.) The loss is the
    mean of the slices' losses, i.e. the global batch's mean loss.
    """
    cfg = cfg or GPTConfig()
    torch.set_num_threads(1)
    model = GPT(cfg, seed=seed)
    optimizer, master = setup_precision(model, precision)  # bf16-mixed: bf16 model, fp32 master
    losses = []
    for k in range(steps):
        tokens, targets = global_batch(k, cfg, batch_size, seed)
        model.zero_grad(set_to_none=True)
        step_loss = 0.0
        for r in range(accumulate):
            loss = model(rank_slice(tokens, r, accumulate), rank_slice(targets, r, accumulate))
            loss.backward()
            step_loss += loss.item()
        if accumulate > 1:
            for p in model.parameters():
                grad_of(p).div_(accumulate)
        (master or optimizer).step()
        losses.append(step_loss / accumulate)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="instrumented_runs.single")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--global-batch", type=int, default=DEFAULT_GLOBAL_BATCH)
    p.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="fp32")
    a = p.parse_args(argv)
    losses, _ = train_single(a.steps, batch_size=a.global_batch, seed=a.seed, precision=a.precision)
    for k, loss in enumerate(losses):
        print(f"step {k} loss {loss:.6f}", file=sys.stderr)


if __name__ == "__main__":
    main()
