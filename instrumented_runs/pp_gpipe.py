"""GPipe: all forwards, then all backwards, then a synchronous flush (Huang et al., arXiv:1811.06965).

Idea. Cut the model into p stages (one per rank, see ``instrumented_runs.pipeline``) and the
batch into m microbatches. Stage s runs the forwards of microbatches 0..m-1 as their activations
arrive, then their backwards as the gradients come back, accumulating gradients; after the last
backward every stage applies one optimizer step (the flush): synchronous SGD, exactly
single-process training on the whole batch.

Bubble. With uniform stages (forward f, backward b per microbatch) the step takes
(m + p - 1)(f + b): the first microbatch needs p-1 forward hops to reach the last stage and its
gradient p-1 backward hops to come back, and each stage computes only m(f + b). The idle
("bubble") fraction of the step is

    bubble = (p - 1) / (m + p - 1)          (GPipe; Megatron writes (p-1)/m, relative to m(f+b))

p=4, m=8: 3/11 = 27 %. More microbatches shrink it, but stage s must keep the activations of all
m microbatches until their backwards: m in flight on every stage.

The replay (tracekit.analyses.replay) of p=4, m=4 with f=1, b=2 (digits: forwards of microbatch
0..3, letters a..d: their backwards, dots: bubble); 21 time units, 4 x 12 busy, 3/7 idle:

    stage 0  0123.........aabbccdd
    stage 1  .0123......aabbccdd..
    stage 2  ..0123...aabbccdd....
    stage 3  ...0123aabbccdd......

Phases of a step on stage s (named in the code):
    fill / forwards     F0 .. F(m-1): stage s idles ~s f before its first forward (fill)
    backwards           B0 .. B(m-1) (first in, first out, as torch's ScheduleGPipe); stage s
                        idles from its last forward until the first gradient reaches it
    flush               wait for every send; one optimizer step; the loss to every rank

Trace signature. Per stage and step: m ``F:s<s>:mb<j>`` spans, then m ``B:s<s>:mb<j>``; between
them ``comm:recv:act|grad:mb<j>:peer<r>`` (blocking: the wait for upstream is inside) and short
``comm:send:*`` launches whose ``gloo:send`` spans run until the peer receives; then
``comm:wait:sends``, ``optimizer`` and ``comm:broadcast:loss``. In-flight microbatches peak at m on
every stage; the analysis's bubble_fraction should sit near (p-1)/(m+p-1) and near its replay.

Run: ``tracekit run pp-gpipe --nproc 4 --microbatches 8`` or
``torchrun --nproc-per-node 4 -m instrumented_runs.pp_gpipe --microbatches 8``.
"""

from __future__ import annotations

import torch

from instrumented_runs import harness
from instrumented_runs.model import make_optimizer
from instrumented_runs.pipeline import StageRunner, flush, setup, split_microbatches
from tracekit import labels
from tracekit.capture import region
from tracekit.strategies import schedules


class GPipe:
    """One stage of a GPipe pipeline: m forwards, m backwards, flush."""

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
            # phases: fill + forwards (all m microbatches go down the pipeline), then backwards
            # (gradients come back up; stage s holds all m activations until then)
            r.run(schedules.gpipe(m), micro)
            # phase: flush: every send received, then one synchronous optimizer step
            return flush(r, self.optimizer)


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("pp-gpipe", argv)
    stage, runner, _ = setup(ctx, "gpipe")
    optimizer = make_optimizer(stage.parameters())
    gpipe = GPipe(runner, optimizer)
    ctx.count_memory_at(
        optimizer,
        lambda: dict(
            params=stage.parameters(),
            grads=[p.grad for p in stage.parameters()],
            optimizer=optimizer,
        ),
    )
    harness.run(ctx, gpipe.train_step, stage.global_state_dict)


if __name__ == "__main__":
    harness.entrypoint(main)
