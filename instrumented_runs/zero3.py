"""ZeRO stage 3: parameters partitioned too (P_os+g+p; Rajbhandari et al., arXiv:1910.02054).

Idea. After ZeRO-2 (zero2.py) every rank still keeps all the parameters, although a layer needs
its weights only while it computes. ZeRO-3 keeps 1/N of every parameter at rest and rebuilds each
layer just in time. The model is cut into *units* (here: unit 0 = the embeddings, units 1..L =
the transformer blocks, unit L+1 = final LayerNorm and head); per step, per unit i:

    forward   gather   w_i = all_gather(w_i[0] .. w_i[N-1])      before unit i computes
              compute  x_{i+1} = unit_i(x_i; w_i)
              free     drop w_i                                    only the slice w_i[r] stays
    backward  gather   w_i = all_gather(...) again                 when the gradient reaches unit i
              compute  dx_i, dw_i = unit_i'(dx_{i+1}; w_i)
              free     drop w_i
              reduce   g_i[r] = reduce_scatter(dw_i)[r], then drop dw_i
    step      Adam on the owned slices w_i[r] with g_i[r]; nothing is gathered after it

Prefetch (``--prefetch k``, default 1): while unit i computes, the all-gathers of the next k units
(forward: i+1..i+k, backward: i-1..i-k) are already in flight, so their transfer hides under
unit i's compute, at the price of holding up to k+1 gathered units at once. With ``--prefetch 0``
each gather starts only when its unit needs it and is fully exposed.

The backward gather is triggered by a hook on each unit's output tensor (it fires when the
gradient w.r.t. that output is complete, i.e. just before the unit's backward); the end of a
unit's backward is when post-accumulate-grad hooks have seen all of its parameters. Freeing keeps
the tensors and releases their memory (``untyped_storage().resize_(0)``, as FSDP1 does), so the
tensors autograd saved for backward see the weights again once the backward gather refills them.

Memory per rank (counted from the tensors at the step boundary, never from these formulas):

    bf16-mixed (K=12)   (2 params + 2 grads + 12 optimizer) Psi / N = 16 Psi / N
    fp32                (4 params + 4 grads +  8 optimizer) Psi / N = 16 Psi / N

plus, transiently, the gathered units (one, or k+1 with prefetch) and one unit's full gradient.

Communication per rank per step (ideal ring): forward all-gather (N-1)/N Psi + backward all-gather
(N-1)/N Psi + reduce-scatter (N-1)/N Psi = 3 Psi (N-1)/N, i.e. 1.5x DP / ZeRO-1 / ZeRO-2
(2 Psi (N-1)/N). Gloo runs each reduce-scatter as a full all-reduce of the unit.

Trace signature. On the main thread, per unit and step: ``comm:all_gather:unit<i>:fwd`` (holding
``c10d::_allgather_base_``) and ``comm:wait:unit<i>:fwd`` inside ``forward``, then in
``backward`` ``comm:all_gather:unit<i>:bwd``, ``comm:wait:unit<i>:bwd`` and
``comm:reduce_scatter:unit<i>`` (``c10d::_reduce_scatter_base_``), and after backward
``comm:wait:unit<i>:reduce``. The transfers are ``gloo:all_gather`` (one slice per rank) and
``gloo:all_reduce`` (the full unit) spans on ``pt_gloo_runloop`` threads. With prefetch >= 1 the
launch of unit i+1's forward gather comes *before* unit i's forward compute; with 0, after it.

Run: ``torchrun --nproc-per-node 2 -m instrumented_runs.zero3 --prefetch 1`` or
``tracekit run zero3 --prefetch 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from instrumented_runs import harness
from instrumented_runs.c10d import all_gather_single, grad_of, reduce_scatter_single, wait
from instrumented_runs.model import GPT, loss_fn
from instrumented_runs.sharding import FlatGroup, ShardOptimizer, UnitActivationMeter
from tracekit import labels
from tracekit.capture import region
from tracekit.labels import BWD, FWD

DEFAULT_PREFETCH = 1


@dataclass
class Unit:
    """One unit's flat parameters: the gathered buffer (memory freed between uses) and the slice kept."""

    layout: FlatGroup
    name: str
    full: torch.Tensor  # the whole unit, flat; its storage is empty while freed
    shard: torch.Tensor  # this rank's slice, kept between steps
    grad_shard: torch.Tensor  # this rank's reduced gradient slice, kept until the step
    grad_full: torch.Tensor | None = None  # the unit's full gradient during its backward
    pending: int = 0  # parameters whose gradient has not arrived this step
    gathered: bool = False
    gather: dist.Work | None = field(default=None, repr=False)
    reduce: dist.Work | None = field(default=None, repr=False)

    @property
    def index(self) -> int:
        return self.layout.index

    @property
    def nbytes(self) -> int:
        return self.layout.padded * self.full.element_size()


# --- collectives, each inside its label --------------------------------------------------------


def all_gather_unit(unit: Unit, direction: str, group: dist.ProcessGroup) -> dist.Work:
    """Launch the rebuild of the unit's parameters from every rank's slice."""
    with region(labels.all_gather_unit(unit.index, direction)):
        return all_gather_single(unit.full, unit.shard, group=group, async_op=True)


def wait_gather(unit: Unit, direction: str) -> None:
    with region(labels.wait(labels.unit(unit.index), direction)):
        wait(unit.gather, f"unit {unit.index} gather")
    unit.gather = None


def reduce_scatter_unit(unit: Unit, group: dist.ProcessGroup) -> dist.Work:
    """Launch the sum of the unit's gradient over the group; this rank receives its slice."""
    with region(labels.reduce_scatter_unit(unit.index)):
        return reduce_scatter_single(
            unit.grad_shard, unit.grad_full, op=dist.ReduceOp.SUM, group=group, async_op=True
        )


def wait_reduce(unit: Unit) -> None:
    with region(labels.wait(labels.unit(unit.index), "reduce")):
        wait(unit.reduce, f"unit {unit.index} reduce")
    unit.reduce = None


# --- the strategy ------------------------------------------------------------------------------


#: a unit: its name, its named parameters, its forward
UnitSpec = tuple[str, list[tuple[str, nn.Parameter]], Callable[..., torch.Tensor]]


def model_units(model: GPT) -> list[UnitSpec]:
    """(name, named parameters, forward) per unit, in forward order: embeddings, blocks, head."""

    def named(prefix: str, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
        return [(f"{prefix}.{n}", p) for n, p in module.named_parameters()]

    units: list[UnitSpec] = [
        ("embed", named("tok_emb", model.tok_emb) + named("pos_emb", model.pos_emb), model.embed)
    ]
    units += [(f"blocks.{i}", named(f"blocks.{i}", b), b) for i, b in enumerate(model.blocks)]
    units.append(("head", named("ln_f", model.ln_f) + named("head", model.head), model.logits))
    return units


class ZeRO3:
    """Only this rank's slice of every unit at rest; units gathered just in time, freed after use."""

    def __init__(
        self,
        model: GPT,
        precision: str,
        group: dist.ProcessGroup,
        prefetch: int = DEFAULT_PREFETCH,
    ) -> None:
        self.model, self.group, self.prefetch = model, group, prefetch
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.units: list[Unit] = []
        self.forwards: list[Callable] = []
        for i, (name, named, forward) in enumerate(model_units(model)):
            layout = FlatGroup(i, [p for _, p in named], [n for n, _ in named], self.world_size)
            full = layout.flatten()  # same seed on every rank: same weights
            shard = layout.shard(full, self.rank).clone()
            layout.bind_params(full)  # parameters are views into `full` ...
            unit = Unit(
                layout,
                name,
                full,
                shard,
                torch.zeros_like(shard),
                pending=len(layout.params),
                gathered=True,
            )
            self._free(unit)  # ... whose memory is released: only the slice stays
            self.units.append(unit)
            self.forwards.append(forward)
            for p, offset in zip(layout.params, layout.offsets):
                p.register_post_accumulate_grad_hook(self._grad_ready_hook(unit, offset))
        self.opt = ShardOptimizer([u.shard for u in self.units], precision)

    def describe(self) -> list[dict]:
        return [{"name": u.name, **u.layout.describe()} for u in self.units]

    # -- gather / free ---------------------------------------------------------------------------

    def _launch_gather(self, unit: Unit, direction: str) -> None:
        if unit.gathered or unit.gather is not None:
            return
        unit.full.untyped_storage().resize_(unit.nbytes)  # memory for the whole unit again
        unit.gather = all_gather_unit(unit, direction, self.group)

    def _fetch(self, unit: Unit, direction: str) -> None:
        """The unit's parameters, complete: wait for a prefetched gather, or gather now."""
        self._launch_gather(unit, direction)
        if unit.gather is not None:
            wait_gather(unit, direction)
        unit.gathered = True

    def _free(self, unit: Unit) -> None:
        unit.full.untyped_storage().resize_(0)
        unit.gathered = False

    # -- forward ---------------------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = tokens
        for i, unit in enumerate(self.units):
            # phase: gather (and prefetch the next units' gathers, to overlap this unit's compute)
            self._fetch(unit, FWD)
            for nxt in self.units[i + 1 : i + 1 + self.prefetch]:
                self._launch_gather(nxt, FWD)
            # phase: compute
            x = self.forwards[i](x)
            # phase: free; the backward gathers again when the gradient reaches this output
            self._free(unit)
            x.register_hook(self._pre_backward_hook(unit))
        return loss_fn(x, targets)

    # -- backward --------------------------------------------------------------------------------

    def _pre_backward_hook(self, unit: Unit) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            # phase: gather for the backward, prefetching the units whose backward comes next
            self._fetch(unit, BWD)
            for prev in reversed(self.units[max(0, unit.index - self.prefetch) : unit.index]):
                self._launch_gather(prev, BWD)

        return hook

    def _grad_ready_hook(self, unit: Unit, offset: int) -> Callable[[nn.Parameter], None]:
        def hook(param: nn.Parameter) -> None:
            if unit.grad_full is None:  # first gradient of the unit this step
                unit.grad_full = torch.zeros(
                    unit.layout.padded, dtype=param.dtype, device=param.device
                )
            unit.grad_full[offset : offset + param.numel()].copy_(grad_of(param).reshape(-1))
            param.grad = None
            unit.pending -= 1
            if unit.pending == 0:  # the unit's backward is over
                self._free(unit)  # phase: free
                unit.grad_full.div_(self.world_size)  # phase: reduce (mean, async)
                unit.reduce = reduce_scatter_unit(unit, self.group)

        return hook

    def finish_reduce(self) -> None:
        for unit in self.units:
            if unit.pending != 0:
                raise RuntimeError(
                    f"unit {unit.index} ({unit.name}) got no gradient for some parameters"
                )
            wait_reduce(unit)
            unit.grad_full = None  # only the reduced slice stays
            unit.pending = len(unit.layout.params)

    # -- the step --------------------------------------------------------------------------------

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """One step; returns this rank's local loss."""
        with region(labels.STEP):
            with region(labels.FORWARD):
                loss = self.forward(tokens, targets)
            with region(labels.BACKWARD):
                loss.backward()
            self.finish_reduce()
            # phase: update, Adam on the owned slices; the next forward gathers the new weights
            with region(labels.OPTIMIZER):
                self.opt.step([u.grad_shard for u in self.units])
        return loss.item()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every unit gathered once more (after training, outside the profiled steps)."""
        state = {}
        for unit in self.units:
            self._fetch(unit, FWD)
            state.update(
                {n: p.detach().clone() for n, p in zip(unit.layout.names, unit.layout.params)}
            )
            self._free(unit)
        return state


def main(argv: list[str] | None = None) -> None:
    ctx = harness.start("zero3", argv)
    prefetch = DEFAULT_PREFETCH if ctx.args.prefetch is None else ctx.args.prefetch
    model = GPT(ctx.model_config, seed=ctx.args.seed).to(ctx.device)
    if ctx.args.precision == "bf16-mixed":
        model.to(torch.bfloat16)
    zero = ZeRO3(model, ctx.args.precision, ctx.group, prefetch=prefetch)
    ctx.strategy_options.update(
        zero_stage=3, dp_degree=zero.world_size, prefetch=prefetch, units=zero.describe()
    )
    ctx.meter_activations(UnitActivationMeter(lambda: [u.full for u in zero.units]))
    ctx.count_memory_at(
        zero.opt.optimizer,
        lambda: dict(
            params=[u.shard for u in zero.units],
            grads=[*(u.grad_shard for u in zero.units), *(p.grad for p in model.parameters())],
            optimizer=zero.opt.optimizer,
            extra_optimizer=zero.opt.master_copies(),
        ),
    )
    harness.run(ctx, zero.train_step, zero.full_state_dict, (zero.rank, zero.world_size))


if __name__ == "__main__":
    harness.entrypoint(main)
