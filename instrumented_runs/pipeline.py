"""Pipeline parallelism: what GPipe, 1F1B and PipeDream share (the stages, the microbatches, p2p).

Split by layer (GPipe, Huang et al., arXiv:1811.06965). The model is cut between layers into p
contiguous stages, one per rank; rank s owns stage s outright (its parameters, gradients and
optimizer state: model states per rank ~ 16 Psi / p in fp32 with Adam, no replication)::

    stage 0        embeddings  + blocks [0, L/p)
    stage s        blocks [s L/p, (s+1) L/p)
    stage p-1      blocks [(p-1) L/p, L) + final LayerNorm + head + loss

Microbatches. The global batch of B sequences is split into m microbatches of B/m sequences.
Microbatch j's activations flow down the pipeline (stage s sends its output to s+1) and its
gradients flow back up (stage s+1 sends dL/d(input) to s). The step's loss is the batch mean,

    L = (1/B) sum_i l_i = (1/m) sum_j L_j,      L_j = mean loss of microbatch j,

so each microbatch's loss is scaled by 1/m before its backward and the gradients accumulated over
the m backwards are exactly the full-batch gradient (GPipe and 1F1B then equal single-process
training; PipeDream deliberately does not: it updates after every microbatch).

Schedules (one file each): ``pp_gpipe`` (all forwards, all backwards, flush), ``pp_1f1b``
(PipeDream-Flush: warm-up, one-forward-one-backward, cool-down, flush) and ``pp_pipedream``
(asynchronous, weight stashing); their op orders are tracekit.strategies.schedules', the lists
the analysis replays. They share :class:`StageRunner`, which runs one microbatch's forward ``F``
or backward ``B`` on this rank's stage with its p2p around it.

Point-to-point, each call inside its label (peer = the other rank)::

    comm:recv:act:mb<j>:peer<r>    wait for microbatch j's input from upstream (the span is the
                                   time this stage sat blocked, waiting for upstream)
    F:s<s>:mb<j>                   the forward compute, nothing else (loss included on the last)
    comm:send:act:mb<j>:peer<r>    asynchronous send downstream (isend; waited at the flush)
    comm:recv:grad:mb<j>:peer<r>   wait for dL/d(output) from downstream
    B:s<s>:mb<j>                   the backward compute
    comm:send:grad:mb<j>:peer<r>   asynchronous send of dL/d(input) upstream

The schedules post their receives ahead (``irecv``, :class:`PostedRecv`): inside the span of
microbatch j's receive, j+1's is posted, then j's waited, so the message moves while the stage
computes and the span is the time spent blocked. Sends are asynchronous and receives are waited
in schedule order, and on every (src, dst) pair messages go in one direction only (activations
down, gradients up) in microbatch order, so no schedule here can deadlock: gloo matches the k-th
send to the k-th receive of a pair.

Memory. :class:`instrumented_runs.meters.StageMeter`, hooked around each step by the harness and
after each op by the runner's ``after_op``, counts the bytes autograd keeps for backward on this
stage (parameters excluded); a microbatch's are freed by its backward. So the peak is
(max in-flight microbatches) x (bytes per microbatch): m x for GPipe, (p-s) x for 1F1B.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from instrumented_runs import harness
from instrumented_runs.c10d import grad_of, started
from instrumented_runs.data import rank_slice
from instrumented_runs.meters import StageMeter
from instrumented_runs.model import GPT, GPTConfig, loss_fn
from tracekit import labels, theory
from tracekit.capture import region
from tracekit.strategies.schedules import FORWARD, Op

SEND_WAIT = "sends"  # comm:wait:sends, the flush's wait for outstanding isends
LOSS = "loss"  # comm:broadcast:loss, the last stage's loss to every rank


def stage_layers(n_layers: int, stages: int, stage: int) -> tuple[int, int]:
    """Blocks [lo, hi) of ``stage``: contiguous, as even as possible."""
    return stage * n_layers // stages, (stage + 1) * n_layers // stages


class Stage(nn.Module):
    """This rank's contiguous piece of the GPT. Built by cutting a whole seeded GPT, so every
    weight is bit-identical to the single-process model's."""

    def __init__(self, cfg: GPTConfig, seed: int, stage: int, stages: int) -> None:
        super().__init__()
        gpt = GPT(cfg, seed=seed)
        self.stage, self.stages = stage, stages
        self.first, self.last = stage == 0, stage == stages - 1
        self.lo, self.hi = stage_layers(cfg.n_layers, stages, stage)
        if self.first:
            self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
        self.blocks = nn.ModuleList(gpt.blocks[self.lo : self.hi])
        if self.last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """tokens -> hidden (first stage), hidden -> hidden, hidden -> logits (last stage)."""
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x

    def global_name(self, name: str) -> str:
        """``blocks.0.x`` of stage s -> the whole model's ``blocks.<lo>.x``."""
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            return f"blocks.{self.lo + int(i)}.{rest}"
        return name

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        return {self.global_name(k): v for k, v in self.state_dict().items()}


def split_microbatches(
    tokens: torch.Tensor, targets: torch.Tensor, m: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """m contiguous microbatches of the global batch (B must divide by m)."""
    return [(rank_slice(tokens, j, m), rank_slice(targets, j, m)) for j in range(m)]


# --- point-to-point, each inside its label ------------------------------------------------------


def _via_host(group: dist.ProcessGroup) -> bool:
    """gloo sends from host memory only (a CUDA pointer makes its writev fail with EFAULT), so on
    gloo a CUDA tensor is staged through the host: a D2H copy before isend, H2D after recv."""
    return dist.get_backend(group) == "gloo"


def _buffer(shape: tuple[int, ...], group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, device="cpu" if _via_host(group) else device)


def _isend(t: torch.Tensor, dst: int, group: dist.ProcessGroup) -> dist.Work:
    return started(
        dist.isend(
            t.contiguous().cpu() if _via_host(group) else t.contiguous(), dst=dst, group=group
        )
    )


def send_activation(x: torch.Tensor, mb: int, dst: int, group: dist.ProcessGroup) -> dist.Work:
    """Start sending microbatch ``mb``'s activations to downstream rank ``dst``."""
    with region(labels.p2p("send", "act", mb, dst)):
        return _isend(x, dst, group)


def send_grad(g: torch.Tensor, mb: int, dst: int, group: dist.ProcessGroup) -> dist.Work:
    """Start sending dL/d(input) of microbatch ``mb`` to upstream rank ``dst``."""
    with region(labels.p2p("send", "grad", mb, dst)):
        return _isend(g, dst, group)


class PostedRecv:
    """A receive posted ahead of its use (``irecv``), so the transfer runs while this stage
    computes. gloo moves a message only once both sides have posted: a receive posted when needed
    waits for the sender's gloo thread to answer its "ready" and write the data, thread wake-ups in
    another process, on the pipeline's critical path even when the send was long done (measured,
    p=4, m=8 on 2 shared cores: such a receive took 3-6 ms median; posted ahead, 0.07 ms)."""

    def __init__(
        self,
        mb: int,
        src: int,
        shape: tuple[int, ...],
        group: dist.ProcessGroup,
        device: torch.device,
    ) -> None:
        self.mb, self.device = mb, device
        self.buf = _buffer(shape, group, device)
        self.work = started(dist.irecv(self.buf, src=src, group=group))

    def wait(self) -> torch.Tensor:
        """Block until it has arrived."""
        self.work.wait()
        return self.buf.to(self.device)


def wait_sends(works: list[dist.Work], *qualifiers: str) -> None:
    """The flush: every send of the step has been received (``comm:wait:sends``)."""
    with region(labels.wait(SEND_WAIT, *qualifiers)):
        for w in works:
            w.wait()
    works.clear()


def broadcast_loss(loss: float, src: int, group: dist.ProcessGroup) -> float:
    """The step's loss lives on the last stage; give it to every rank (for the log)."""
    t = torch.tensor(
        [loss],
        dtype=torch.float64,
        device="cpu" if _via_host(group) else torch.device("cuda", torch.cuda.current_device()),
    )
    with region(labels.comm("broadcast", LOSS)):
        dist.broadcast(t, src=src, group=group)
    return float(t.item())


# --- one stage, one microbatch at a time ---------------------------------------------------------


class StageRunner:
    """Runs F and B of single microbatches on this rank's stage; the schedules decide the order.

    Keeps, per microbatch in flight, the stage's input and its output (or scaled loss) until the
    backward. Measurement hooks on from outside (``after_op``: instrumented_runs.meters).
    """

    def __init__(
        self, stage: Stage, group: dist.ProcessGroup, microbatches: int, mb_shape: tuple[int, ...]
    ) -> None:
        self.stage, self.group, self.m, self.mb_shape = stage, group, microbatches, mb_shape
        self.s, self.p = stage.stage, stage.stages
        self.device = next(stage.parameters()).device
        rank = dist.get_rank(group)
        self.prev = dist.get_global_rank(group, rank - 1) if not stage.first else None
        self.next = dist.get_global_rank(group, rank + 1) if not stage.last else None
        self.last_rank = dist.get_global_rank(group, self.p - 1)
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # mb -> (input, output)
        self.sends: list[dist.Work] = []
        self.expected: dict[str, deque[int]] = {"act": deque(), "grad": deque()}
        self.posted: dict[str, deque[PostedRecv]] = {"act": deque(), "grad": deque()}
        self.losses: dict[int, float] = {}  # mb -> unscaled loss (last stage)
        self.after_op: list[Callable[[str, int], None]] = []  # hooks: (kind, mb) after F / B

    def expect(self, what: str, mbs: Iterable[int]) -> None:
        """The microbatches whose activations (``"act"``, from upstream) or output gradients
        (``"grad"``, from downstream) this stage receives next, in this order; their receives are
        posted ahead (:class:`PostedRecv`). Without an expectation a receive is posted when
        needed and waited at once."""
        if (what == "act" and not self.stage.first) or (what == "grad" and not self.stage.last):
            self.expected[what].extend(mbs)
            self._post(what)

    def _peer(self, what: str) -> int:
        """Where ``what`` comes from: activations from upstream, output gradients from
        downstream (the first stage receives no activations, the last no gradients)."""
        peer = self.prev if what == "act" else self.next
        if peer is None:
            raise RuntimeError(f"stage {self.s} of {self.p} receives no {what}")
        return peer

    def _post(self, what: str) -> None:
        if self.expected[what]:
            src = self._peer(what)
            self.posted[what].append(
                PostedRecv(
                    self.expected[what].popleft(), src, self.mb_shape, self.group, self.device
                )
            )

    def _receive(self, what: str, mb: int) -> torch.Tensor:
        """Microbatch ``mb``'s input (act) or output gradient (grad): inside its ``comm:recv`` span,
        the next expected receive is posted, then this one is waited. Posting first puts the post
        (it takes the gloo pair's lock, which the gloo thread holds while it reads this very
        message) inside the wait rather than after it; at most two receives are posted per
        direction, so 1F1B still holds p - s microbatches and not m."""
        src = self._peer(what)
        with region(labels.p2p("recv", what, mb, src)):
            posted = (
                self.posted[what].popleft()
                if self.posted[what]
                else PostedRecv(mb, src, self.mb_shape, self.group, self.device)
            )
            if (
                posted.mb != mb
            ):  # gloo matches receives in posting order: mb would get another's data
                raise RuntimeError(
                    f"stage {self.s}: {what} of microbatch {mb} needed, {posted.mb} expected next"
                )
            self._post(what)
            return posted.wait()

    def forward(
        self,
        mb: int,
        tokens: torch.Tensor | None,
        targets: torch.Tensor | None,
        version: int | None = None,
    ) -> None:
        """Receive (not on stage 0), compute F, send downstream (not on the last stage).
        The first stage takes ``tokens``, the last ``targets``."""
        if self.stage.first:
            if tokens is None:
                raise ValueError("the first stage computes on the microbatch's tokens")
            x = tokens
        else:
            x = self._receive("act", mb).requires_grad_()
        with region(labels.pipeline("F", self.s, mb, version)):
            y = self.stage(x)
            if self.stage.last:
                if targets is None:
                    raise ValueError("the last stage computes the loss of the targets")
                y = loss_fn(y, targets) / self.m  # loss scaling: L = (1/m) sum_j L_j
        self.saved[mb] = (x, y)
        if self.stage.last:
            self.losses[mb] = y.item() * self.m
        else:
            self.sends.append(send_activation(y.detach(), mb, self._peer("grad"), self.group))
        for hook in self.after_op:
            hook("F", mb)

    def backward(
        self, mb: int, version: int | None = None, staleness: int | None = None
    ) -> torch.Tensor | None:
        """Receive dL/d(output) (not on the last stage), compute B, send dL/d(input) upstream.
        Returns the received output gradient (None on the last stage)."""
        x, y = self.saved.pop(mb)
        grad = None if self.stage.last else self._receive("grad", mb)
        with region(labels.pipeline("B", self.s, mb, version, staleness)):
            torch.autograd.backward(y, grad)
        if not self.stage.first:
            self.sends.append(send_grad(grad_of(x), mb, self._peer("act"), self.group))
        for hook in self.after_op:
            hook("B", mb)
        return grad

    def run(self, order: Iterable[Op], micro: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Run ``order`` (tracekit.strategies.schedules) on the microbatches ``micro``."""
        for kind, j in order:
            if kind == FORWARD:
                self.forward(j, *micro[j])
            else:
                self.backward(j)

    def input_of(self, mb: int) -> torch.Tensor:
        return self.saved[mb][0]

    def prune_sends(self) -> None:
        """Forget sends that completed (PipeDream never flushes)."""
        self.sends = [w for w in self.sends if not w.is_completed()]

    def step_loss(self, mbs: Iterable[int]) -> float | None:
        """Mean loss of these microbatches (last stage), None elsewhere: only the last stage knows."""
        mbs = list(mbs)
        if not self.stage.last:
            return None
        return sum(self.losses.pop(j) for j in mbs) / len(mbs)


def flush(runner: StageRunner, optimizer: torch.optim.Optimizer) -> float:
    """The synchronous flush of GPipe and 1F1B: every send received, then one optimizer step,
    then the step's loss to every rank."""
    wait_sends(runner.sends)
    with region(labels.OPTIMIZER):
        optimizer.step()
    loss = runner.step_loss(range(runner.m))
    return broadcast_loss(0.0 if loss is None else loss, runner.last_rank, runner.group)


# --- setting up and finishing a pipeline run ------------------------------------------------------


def setup(ctx: harness.Context, schedule: str) -> tuple[Stage, StageRunner, StageMeter]:
    """Stage of this rank, its runner and the meter the harness hooks around each step
    (memory/rank<R>.json: activations, microbatches in flight); records the pipeline options
    in run.json."""
    p, cfg = ctx.world_size, ctx.model_config
    m = ctx.args.microbatches or 2 * p  # default: m = 2p (the layout: checked by the harness)
    if ctx.args.global_batch % m:
        raise SystemExit(
            f"{ctx.strategy}: --global-batch {ctx.args.global_batch} does not divide into {m} microbatches"
        )
    stage = Stage(cfg, ctx.args.seed, dist.get_rank(ctx.group), p).to(ctx.device)
    mb_shape = (ctx.args.global_batch // m, cfg.seq_len, cfg.d_model)
    runner = StageRunner(stage, ctx.group, m, mb_shape)
    meter = StageMeter(runner)
    ctx.meter_steps(meter)
    ctx.strategy_options.update(
        schedule=schedule,
        stages=p,
        microbatches=m,
        microbatch_size=mb_shape[0],
        stage_layers=[list(stage_layers(cfg.n_layers, p, s)) for s in range(p)],
        bubble_fraction_theory=theory.pipeline_bubble_fraction(p, m)
        if schedule != "pipedream"
        else None,
    )
    return stage, runner, meter


def share_losses(
    ctx: harness.Context, runner: StageRunner, losses: list[float | None]
) -> list[float | None]:
    """Every rank gets the last stage's losses (after training, outside the profiled steps)."""
    box = [losses]
    dist.broadcast_object_list(box, src=runner.last_rank, group=ctx.meta_group)
    return box[0]
