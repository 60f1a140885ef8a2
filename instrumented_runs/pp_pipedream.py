"""Asynchronous PipeDream: 1F1B without a flush, with weight stashing (Harlap et al., arXiv:1806.03377).

Idea. GPipe and PipeDream-Flush idle while the pipeline fills and drains at every step. PipeDream
never flushes: each stage runs one endless 1F1B stream (warm-up once, at the very start) and
updates its own weights after *every* microbatch's backward, with its local optimizer. The
stages stay busy; the price is staleness: stage s starts p-s-1 more forwards before the backward
of a microbatch comes back, so between a microbatch's forward and its backward the stage's
weights change p-s-1 times.

Weight stashing. A backward must use the weights its forward used, or the gradient is of a
function that was never evaluated. So stage s keeps every version still needed by a microbatch in
flight: the forward of microbatch j uses the latest version v and stashes it; its backward
differentiates through version v (the stashed one, not the latest); the resulting gradient
updates the latest weights (version v + staleness -> one newer). In steady state the p-s
microbatches in flight on stage s each used a different version, so

    versions held at stage s = p - s           (the last stage: 1; stage 0: p)
    staleness of stage s's updates = p - s - 1

(PipeDream-2BW, arXiv:2006.09503, caps this at 2 versions with gradient accumulation.)

Here a version is a set of parameter tensors. The forward of a microbatch builds its autograd
graph on the current tensors, which keeps them alive: that is the stash. Before an update, if a
microbatch in flight still uses the current tensors, they are kept as the stashed version and the
update goes to a fresh copy (copy-on-write; Adam's state moves with it); otherwise the update is
in place. Memory: p - s copies of the stage's parameters.

Steps. Without a flush a "step" is just m microbatches of the stream: step k runs stream ops
2mk .. 2m(k+1)-1 (m forwards and m backwards on every stage, from neighbouring steps), the
stream's cool-down comes at the end of the last step. Microbatches are numbered globally,
g = step x m + j, so ``F:s1:mb17:v12`` is unambiguous across steps.

Bubble. The fill and drain are paid once per run, not once per step: over S steps of m
microbatches, with uniform stages, bubble = (p - 1) / (S m + p - 1) of the whole span, against
GPipe's (p - 1)/(m + p - 1). Compare bubble_fraction_span of the two (there are no step windows).

Trace signature. ``F:s<s>:mb<g>:v<v>`` and ``B:s<s>:mb<g>:v<u>:st<k>`` (the backward used stashed
version u; k = p-s-1 in steady state), an ``optimizer`` span after every backward, p2p labels as
in GPipe, no ``comm:wait:sends`` flush (only ``comm:wait:sends:end`` when training ends).

Run: ``tracekit run pp-pipedream --nproc 4 --microbatches 8``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from instrumented_runs import checks, harness
from instrumented_runs.model import LR
from instrumented_runs.pipeline import (
    StageRunner,
    setup,
    share_losses,
    split_microbatches,
    wait_sends,
)
from tracekit import labels
from tracekit.capture import region
from tracekit.strategies import schedules


class PipeDream:
    """One stage of an asynchronous PipeDream pipeline with weight stashing."""

    def __init__(
        self,
        runner: StageRunner,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        batch_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.runner, self.optimizer, self.batch_of = runner, optimizer, batch_of
        p, s, m = runner.p, runner.s, runner.m
        # one 1F1B stream over every step: warm-up once, cool-down once
        self.stream = schedules.stream("pipedream", p, m, s, total_steps)
        self.slots = [
            (mod, name)
            for mod in runner.stage.modules()
            for name, _ in mod.named_parameters(recurse=False)
        ]
        self.version = 0  # updates applied so far
        self.versions: dict[int, list[nn.Parameter]] = {0: self.live()}  # version -> its tensors
        self.users: Counter[int] = Counter()  # version -> microbatches in flight using it
        self.used: dict[int, int] = {}  # microbatch -> version its forward used
        self.log: list[dict[str, Any]] = []  # per microbatch: versions and staleness
        self.batches: dict[int, list] = {}  # step -> its microbatches

    def live(self) -> list[nn.Parameter]:
        return [getattr(mod, name) for mod, name in self.slots]

    def weights_held(self) -> list[nn.Parameter]:
        """Every version still stashed, and the live weights: p - s copies in steady state."""
        return [t for ts in self.versions.values() for t in ts] + self.live()

    def microbatch(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Microbatch g = step x m + j of the stream: (tokens, targets)."""
        step, j = divmod(g, self.runner.m)
        if step not in self.batches:
            self.batches = {s: b for s, b in self.batches.items() if s >= step - 1}
            self.batches[step] = split_microbatches(*self.batch_of(step), self.runner.m)
        return self.batches[step][j]

    # --- F: the latest version, stashed ---------------------------------------------------------
    def forward(self, g: int) -> None:
        self.used[g] = self.version
        self.users[self.version] += 1
        self.runner.forward(g, *self.microbatch(g), version=self.version)

    # --- B: the stashed version, then a local update of the latest ---------------------------------
    def backward_and_update(self, g: int) -> None:
        u = self.used.pop(g)
        staleness = self.version - u
        self.runner.backward(g, version=u, staleness=staleness)
        got = [
            v for v, ts in self.versions.items() if ts[0].grad is not None
        ]  # who got the gradient
        latest_v = self.version
        with region(labels.OPTIMIZER):
            for latest, stashed in zip(self.live(), self.versions[u]):
                if latest is not stashed:  # gradient of version u -> latest weights
                    latest.grad, stashed.grad = stashed.grad, None
            self.users[u] -= 1
            if self.users[u] == 0 and u != latest_v:
                del self.versions[u]  # no microbatch needs version u any more
            if self.users[latest_v] > 0:
                self._copy_on_write()  # versions[latest_v] stays, as a stash
            else:
                del self.versions[latest_v]  # nobody needs it: update in place
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.version = latest_v + 1
            self.versions[self.version] = self.live()
        self.log.append(
            {
                "mb": g,
                "step": g // self.runner.m,
                "microbatch": g % self.runner.m,
                "f_version": u,
                "b_version": got[0] if len(got) == 1 else None,
                "staleness": staleness,
                "update_version": self.version,
            }
        )

    def _copy_on_write(self) -> None:
        """Swap fresh copies of the latest tensors into the stage and the optimizer; the old
        tensors stay referenced by the in-flight graphs (the stash)."""
        old = self.live()
        group = self.optimizer.param_groups[0]["params"]
        for (mod, name), p in zip(self.slots, old):
            fresh = nn.Parameter(p.detach().clone())
            fresh.grad, p.grad = p.grad, None
            setattr(mod, name, fresh)
            group[next(i for i, q in enumerate(group) if q is p)] = fresh
            if p in self.optimizer.state:
                self.optimizer.state[fresh] = self.optimizer.state.pop(p)

    def versions_held(self) -> int:
        return len(self.versions)

    def train_step(self, k: int, last_step: bool) -> float | None:
        """Stream ops 2mk .. 2m(k+1)-1: m forwards and m backwards of the endless 1F1B stream."""
        r, m = self.runner, self.runner.m
        ops = [(kind, step * m + j) for kind, step, j in self.stream[2 * m * k : 2 * m * (k + 1)]]
        with region(labels.STEP):
            r.expect("act", [g for kind, g in ops if kind == "F"])  # receives posted ahead
            r.expect("grad", [g for kind, g in ops if kind == "B"])
            for kind, g in ops:
                # phase: warm-up (only at the start of step 0), steady 1F1B, cool-down (last step)
                if kind == "F":
                    self.forward(g)
                else:
                    self.backward_and_update(g)
                r.prune_sends()
            if last_step:
                wait_sends(r.sends, "end")  # comm:wait:sends:end: training ends, no flush
        done = [e["mb"] for e in self.log if e["step"] == k] if r.stage.last else []
        return r.step_loss(done)  # None off the last stage (share_losses fills it in later)


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("pp-pipedream", argv)
    stage, runner, meter = setup(ctx, "pipedream")
    m = runner.m
    # one update per microbatch: the fused Adam kernel (a few ops per update, not a few per tensor)
    optimizer = torch.optim.Adam(stage.parameters(), lr=LR, betas=(0.9, 0.95), fused=True)
    pd = PipeDream(runner, optimizer, ctx.total_steps, ctx.batch)
    ctx.strategy_options.update(weight_versions_theory=[runner.p - s for s in range(runner.p)])
    # measurement, hooked on each update: the activation meter skips the weights (live and
    # stashed, by storage); the model states are every copy held
    optimizer.register_step_pre_hook(lambda *_: meter.activations.exclude_only(pd.weights_held()))
    meter.track_max("weight_versions", pd.versions_held)  # per step, into memory/rank<R>.json
    ctx.count_memory_at(
        optimizer,
        lambda: dict(
            params=pd.weights_held(),
            grads=[p.grad for p in pd.live()],
            optimizer=optimizer,
        ),
    )
    checks.save_stashed_backward(ctx, pd)  # TRACEKIT_PP_CHECK=1: what a test recomputes

    def step(k: int) -> float | None:
        return pd.train_step(k, last_step=k == ctx.total_steps - 1)

    losses = harness.train(ctx, step)
    losses = share_losses(ctx, runner, losses)
    weight_versions = meter.profiled_max("weight_versions", ctx.args.warmup)
    harness.finish(
        ctx,
        losses,
        params=stage.global_state_dict(),
        train_extra=dict(
            stage=runner.s,
            stages=runner.p,
            microbatches=m,
            updates=pd.version,
            weight_versions=weight_versions,
            microbatch_log=pd.log,
        ),
    )


if __name__ == "__main__":
    harness.entrypoint(main)
