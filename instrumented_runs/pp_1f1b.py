"""1F1B, PipeDream-Flush: one forward, one backward, then a flush (arXiv:2006.09503, arXiv:2104.04473).

Idea. GPipe keeps every microbatch's activations until the backwards start: m in flight on every
stage. PipeDream (Harlap et al., arXiv:1806.03377) introduced the "one-forward-one-backward"
(1F1B) order; PipeDream-Flush (Narayanan et al., PipeDream-2BW, arXiv:2006.09503) and Megatron-LM
(Narayanan et al., arXiv:2104.04473, section 2.2.1) keep that order but end every step with a
flush, so the weights update synchronously and training equals single-process training.

Schedule on stage r of p, m microbatches (w = min(p - r - 1, m)):

    warm-up     F0 .. F(w-1)                 just enough forwards to fill the stages below
    steady      F(w+i), B(i)  for i < m - w  one forward, then the oldest backward
    cool-down   B(m-w) .. B(m-1)             drain what is still in flight
    flush       wait for the sends, one optimizer step

Each backward frees a microbatch's activations before the next forward adds one, so stage r never
holds more than p - r microbatches (the last stage: 1) instead of GPipe's m:

    in flight at stage r = min(p - r, m)      activation memory ratio GPipe / 1F1B = m / (p - r)

The bubble is unchanged: the first backward still waits for p-1 forward hops and the last
backward on stage 0 for p-1 backward hops, so with uniform stages the step again takes
(m + p - 1)(f + b) and

    bubble = (p - 1) / (m + p - 1)           (Megatron: (p-1)/m relative to the ideal m(f+b))

1F1B buys memory (which then buys a larger m, hence a smaller bubble), not idle time. The replay
of p=4, m=4, f=1, b=2 (compare pp_gpipe's picture: same 21 units, but stage 3 never holds more
than one microbatch, stage 0 four):

    stage 0  0123......aa.bb.cc.dd
    stage 1  .012....aa3bb.cc.dd..
    stage 2  ..01..aa2bb3cc.dd....
    stage 3  ...0aa1bb2cc3dd......

Trace signature. Stage r's spans read F0 .. F(w-1), then alternating F/B, then w backwards, then
``comm:wait:sends``, ``optimizer``, ``comm:broadcast:loss``; the last stage alternates F, B from
the start. The analysis finds max_inflight_microbatches = p - r (exactly) and a bubble_fraction
within noise of GPipe's on the same settings.

Run: ``tracekit run pp-1f1b --nproc 4 --microbatches 8`` or
``torchrun --nproc-per-node 4 -m instrumented_runs.pp_1f1b --microbatches 8``.
"""

from __future__ import annotations

import torch

from instrumented_runs import harness
from instrumented_runs.model import make_optimizer
from instrumented_runs.pipeline import StageRunner, flush, setup, split_microbatches
from tracekit import labels
from tracekit.capture import region
from tracekit.strategies import schedules


class OneFOneB:
    """One stage of a PipeDream-Flush (1F1B) pipeline."""

    def __init__(self, runner: StageRunner, optimizer: torch.optim.Optimizer) -> None:
        self.runner, self.optimizer = runner, optimizer

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        r, m = self.runner, self.runner.m
        micro = split_microbatches(tokens, targets, m)
        with region(labels.STEP):
            r.expect("act", range(m))  # posted one ahead: the transfer overlaps compute
            r.expect("grad", range(m))
            with region(labels.ZERO_GRAD):
                self.optimizer.zero_grad(set_to_none=True)
            # phases: warm-up (p-s-1 forwards fill the stages below this one), steady 1F1B (one
            # forward, then the oldest backward, which frees its activations), cool-down (the
            # backwards still in flight): the order the replay replays
            r.run(schedules.one_f_one_b(r.p, r.s, m), micro)
            # phase: flush: every send received, then one synchronous optimizer step
            return flush(r, self.optimizer)


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("pp-1f1b", argv)
    stage, runner, _ = setup(ctx, "1f1b")
    optimizer = make_optimizer(stage.parameters())
    sched = OneFOneB(runner, optimizer)
    ctx.count_memory_at(
        optimizer,
        lambda: dict(
            params=stage.parameters(),
            grads=[p.grad for p in stage.parameters()],
            optimizer=optimizer,
        ),
    )
    harness.run(ctx, sched.train_step, stage.global_state_dict)


if __name__ == "__main__":
    harness.entrypoint(main)
