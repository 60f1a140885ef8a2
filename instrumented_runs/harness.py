"""What every strategy's ``main()`` calls: options, process group, run folder, profiled loop.

    def main(argv=None):
        ctx = harness.start("dp", argv)                  # parse, init, run folder, run.json
        ...build the model and the strategy's state...
        ctx.count_memory_at(optimizer, lambda: dict(params=..., grads=..., optimizer=optimizer))
        harness.run(ctx, dp.train_step, model.state_dict, shard=(rank, n))
        # = harness.train(ctx, step)   W warm-up steps, then S profiled steps, each on its batch
        #   harness.finish(ctx, ...)   train/, memory/, flight recorder, run.json "ok"

    if __name__ == "__main__":
        harness.entrypoint(main)

Runs the same under ``tracekit run`` (which creates the run folder and passes ``--run-dir``) and
under plain ``torchrun --nproc-per-node N -m instrumented_runs.<strategy> [--out DIR]`` (rank 0
creates ``DIR/<strategy>-<stamp>`` and broadcasts it); started with plain ``python -m`` it is a
one-rank job. Rank 0 writes run.json (status "running", then "ok"); every rank writes its trace,
memory/, train/ and flight-recorder files. Progress goes to stderr only.

What a strategy takes (options, precisions, default global batch, layout check) is its entry in
tracekit.strategies.registry; the options and their checks are tracekit.strategies.options, the same
the launcher uses. Measurement hooks onto the strategy from outside its algorithm: model states
are counted by a step pre-hook on its optimizer (``ctx.count_memory_at``), activations by a
meter around each step (``ctx.meter_activations``, ``ctx.meter_steps``:
instrumented_runs.meters); nothing in a strategy's step mentions either.

Test hooks: ``--fail-rank R`` (or TRACEKIT_FAIL_RANK=R) makes rank R raise at step
``--fail-step`` (default 0, or TRACEKIT_FAIL_STEP); TRACEKIT_HANG_RANK=R makes rank R sleep
forever at step TRACEKIT_HANG_STEP (default 0), after printing "rank R hangs" to stderr;
TRACEKIT_SAVE_PARAMS=1 makes every rank save its final parameters.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from instrumented_runs import contention
from instrumented_runs.data import global_batch, rank_slice
from instrumented_runs.meters import ActivationPeak, StepMeter
from instrumented_runs.model import GPTConfig
from tracekit import capture, runfolder
from tracekit.capture import supervise
from tracekit.capture.straggler import Straggler, install_straggler
from tracekit.strategies import options, registry

# capture.model_states' arguments: params, grads, optimizer, extra_optimizer
States = dict[str, Any]


def parse_args(strategy: registry.Strategy, argv: list[str] | None) -> argparse.Namespace:
    """Parse and check (tracekit.strategies.options, as the launcher does): a bad option, or an
    option the strategy does not use, is one line and exit 2; so is a layout the strategy
    cannot run (before joining the process group, on every rank)."""
    parser = options.rank_parser(strategy, strategy.entry)
    args = parser.parse_args(argv)
    why = options.problem(strategy, args)
    if why:
        parser.error(why)
    args.backend = options.backend_of(args)
    why = strategy.layout_problem(int(os.environ.get("WORLD_SIZE", "1")), args.nodes)
    if why:
        parser.error(why)
    why = options.straggler_problem(args.straggler, int(os.environ.get("WORLD_SIZE", "1")))
    if why:
        parser.error(why)
    if args.fail_rank is None and os.environ.get("TRACEKIT_FAIL_RANK"):
        args.fail_rank = int(os.environ["TRACEKIT_FAIL_RANK"])
        args.fail_step = int(os.environ.get("TRACEKIT_FAIL_STEP", args.fail_step))
    return args


@dataclass
class Context:
    """One rank's view of the job; strategies read it, the harness fills it."""

    strategy: str
    args: argparse.Namespace
    rank: int
    world_size: int
    local_rank: int
    node: int
    host: str
    device: torch.device
    group: dist.ProcessGroup  # the world group, for the strategy's collectives
    meta_group: dist.ProcessGroup  # a gloo group for Python objects and barriers
    run: Path
    model_config: GPTConfig = field(default_factory=GPTConfig)
    memory: dict[str, Any] | None = None
    strategy_options: dict[str, Any] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    topology: list[dict[str, Any]] = field(default_factory=list)
    step: int = -1  # the step running now (train)
    step_meters: list[StepMeter] = field(default_factory=list)  # meter_steps
    finishers: list[Callable[[], None]] = field(default_factory=list)
    straggler: Straggler | None = None  # this rank is the planted straggler

    @property
    def total_steps(self) -> int:
        return self.args.warmup + self.args.steps

    @property
    def memory_step(self) -> int:
        """docs/metrics.md "Memory": just before optimizer.step() of a step after the first."""
        return 1 if self.total_steps > 1 else 0

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of ``step`` on this rank's device."""
        tokens, targets = global_batch(
            step, self.model_config, self.args.global_batch, self.args.seed
        )
        return tokens.to(self.device), targets.to(self.device)

    def dp_batch(self, step: int, dp_rank: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's contiguous slice of the global batch."""
        tokens, targets = self.batch(step)
        return rank_slice(tokens, dp_rank, dp_size), rank_slice(targets, dp_rank, dp_size)

    # --- measurement, hooked onto the strategy from outside its step ------------------------------

    def count_memory_at(
        self, optimizer: torch.optim.Optimizer, states: Callable[[], States]
    ) -> None:
        """Count the model states just before ``optimizer.step()`` in the memory step: a step
        pre-hook on the optimizer (torch.optim.Optimizer.register_step_pre_hook), so the
        strategy's own step never mentions it. ``states()`` returns capture.model_states'
        arguments (params, grads, optimizer, extra_optimizer) as the rank holds them then; an
        optimizer stepped several times in the step (PipeDream) is counted at its last step."""

        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if self.step == self.memory_step:
                self.memory = capture.model_states(**states(), step=self.step)

        optimizer.register_step_pre_hook(hook)

    def meter_activations(self, meter: capture.ActivationMeter, per_step: bool = False) -> None:
        """Count activation bytes with ``meter`` around every step (:func:`train`): its peak over
        the whole run, or (``per_step``) the peak of the memory step alone, goes into
        memory/rank<R>.json ``activation_peak_bytes``."""
        self.meter_steps(ActivationPeak(meter, self.memory_step if per_step else None))

    def meter_steps(self, meter: StepMeter) -> None:
        """Run every step inside ``meter.step(k)`` (:func:`train`); what it measured goes into
        memory/rank<R>.json when the run finishes (:func:`finish`)."""
        self.step_meters.append(meter)

    def at_finish(self, action: Callable[[], None]) -> None:
        """Run ``action`` after training, before the files are written (:func:`finish`)."""
        self.finishers.append(action)


# --- setup --------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _single_process_env() -> None:
    """Plain ``python -m``: a one-rank job on a free local port."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _nccl_logging(run: Path) -> None:
    """NCCL logs into <run>/nccl/ (set before the first NCCL call creates a communicator)."""
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,TUNING")
    os.environ.setdefault("NCCL_DEBUG_FILE", str(runfolder.nccl_dir(run) / "%h.%p.log"))


def _run_json(ctx: Context, topology: list[dict[str, Any]], status: str) -> dict[str, Any]:
    a = ctx.args
    return {
        "schema_version": runfolder.RUN_SCHEMA_VERSION,
        "strategy": ctx.strategy,
        "config": {
            "steps": a.steps,
            "warmup": a.warmup,
            "microbatches": a.microbatches,
            "precision": a.precision,
            "prefetch": a.prefetch,
            "device": a.device,
            "backend": a.backend,
            "nodes": a.nodes,
            "nproc": ctx.world_size,
            "seed": a.seed,
            "global_batch_size": a.global_batch,
            "model": ctx.model_config.as_dict(),
            "params": ctx.model_config.n_params(),
            "strategy_options": ctx.strategy_options,
            "memory_step": ctx.memory_step,
            "straggler": a.straggler,
        },
        "world_size": ctx.world_size,
        "backend": a.backend,
        "device": a.device,
        "precision": a.precision,
        "versions": capture.versions(),
        "environment": capture.environment(
            gpu=torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None
        ),
        "topology": topology,
        "status": status,
        "errors": [],
    }


def _die_with_torchrun() -> None:
    """Under ``tracekit run``: this rank dies when its torchrun does (SIGKILL from the kernel,
    PR_SET_PDEATHSIG), and exits now if torchrun is gone already (its parent no longer carries
    the job's token): it never trains on as an orphan, nor writes run.json after the launcher."""
    token = os.environ.get(supervise.JOB_ENV)
    if token and supervise.die_with_parent(signal.SIGKILL) and not supervise.parent_of_job(token):
        os._exit(1)


def start(name: str, argv: list[str] | None = None) -> Context:
    """Parse options, join the process group, agree on the run folder, write run.json (rank 0).

    What the strategy takes (options, precisions, global batch, layout) is its registry entry."""
    strategy = registry.STRATEGIES[name]
    _die_with_torchrun()
    args = parse_args(strategy, argv)
    capture.exit_on_first_sigterm()  # a stopped rank still writes its trace
    torch.set_num_threads(1)  # torchrun sets OMP_NUM_THREADS=1, but not every launcher does
    _single_process_env()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size % args.nodes:
        raise SystemExit(f"{name}: world size {world_size} does not divide by --nodes {args.nodes}")
    if strategy.splits_batch and args.global_batch % world_size:
        raise SystemExit(
            f"{name}: --global-batch {args.global_batch} does not divide by {world_size} ranks"
        )
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device(
            "cuda", local_rank % torch.cuda.device_count()
        )  # gloo ranks may share a GPU
        torch.cuda.set_device(device)
    if args.run_dir is not None and args.backend == "nccl":
        _nccl_logging(args.run_dir)
    dist.init_process_group(backend=args.backend, timeout=timedelta(minutes=10))
    group = dist.group.WORLD
    meta_group = (
        group
        if args.backend == "gloo"
        else dist.new_group(backend="gloo", group_desc="tracekit_meta")
    )
    if group is None or meta_group is None:  # init_process_group made the world group
        raise RuntimeError("no process group after init_process_group")

    # phase: agree on the run folder (rank 0 creates it unless the launcher did)
    box: list[Any] = [str(args.run_dir) if args.run_dir else None]
    if box[0] is None and rank == 0:
        box[0] = str(runfolder.new_run_dir(args.out, name, time.strftime("%Y%m%d-%H%M%S")))
    dist.broadcast_object_list(box, src=0, group=meta_group)
    run = Path(box[0])
    run.mkdir(parents=True, exist_ok=True)
    if args.backend == "nccl":
        runfolder.nccl_dir(run).mkdir(parents=True, exist_ok=True)
        _nccl_logging(run)

    # phase: topology, contiguous placement: node = rank // (world_size / nodes)
    host = socket.gethostname()
    node = rank // (world_size // args.nodes)
    me = {"rank": rank, "node": node, "host": host, "local_rank": local_rank}
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, me, group=meta_group)
    ctx = Context(
        name, args, rank, world_size, local_rank, node, host, device, group, meta_group, run
    )
    ctx.topology = sorted(everyone, key=lambda r: r["rank"])
    if rank == 0:
        runfolder.write_json_atomic(
            runfolder.run_json_path(run), _run_json(ctx, ctx.topology, "running")
        )
        _log(f"[{name}] {world_size} ranks, {args.backend} on {args.device}, run folder {run}")
    if args.straggler is not None:
        slow_rank, factor = options.parse_straggler(args.straggler)
        if slow_rank == rank:
            ctx.straggler = install_straggler(rank, factor, device)
    contention.attach(ctx)  # contention/rank<R>.json: waiting for a CPU, per step (#27)
    return ctx


# --- the loop -----------------------------------------------------------------------------------


def _one_step(
    ctx: Context, k: int, step_fn: Callable[[int], float | None], losses: list[float | None]
) -> None:
    if ctx.args.fail_rank == ctx.rank and ctx.args.fail_step == k:
        raise RuntimeError(f"injected failure on rank {ctx.rank} at step {k} (test hook)")
    if os.environ.get("TRACEKIT_HANG_RANK") == str(ctx.rank) and os.environ.get(
        "TRACEKIT_HANG_STEP", "0"
    ) == str(k):
        _log(f"[{ctx.strategy}] rank {ctx.rank} hangs at step {k} (test hook)")
        while True:  # a hang: only a signal ends it
            time.sleep(3600)
    ctx.step = k
    if ctx.straggler is not None:
        ctx.straggler.step = k
    t0 = time.perf_counter()
    with ExitStack() as metered:
        for meter in ctx.step_meters:
            metered.enter_context(meter.step(k))
        out = step_fn(k)
    ctx.step_times.append(time.perf_counter() - t0)
    # None: this rank does not hold the loss (a pipeline stage before the last); no number is
    # logged or kept for it, rather than a NaN
    loss = None if out is None else float(out)
    losses.append(loss)
    if ctx.rank == 0:
        kind = "warm-up" if k < ctx.args.warmup else "profiled"
        shown = "" if loss is None else f" loss {loss:.4f}"
        _log(f"[{ctx.strategy}] step {k} ({kind}){shown} {ctx.step_times[-1] * 1e3:.1f} ms")


def train(ctx: Context, step_fn: Callable[[int], float | None]) -> list[float | None]:
    """Run W unprofiled warm-up steps, then S steps under the profiler; this rank's losses per
    step (None for the steps whose loss this rank does not hold: ``step_fn`` returned None)."""
    losses: list[float | None] = []
    try:
        # phase: warm-up (allocators, gloo connections, autograd caches), not traced
        for k in range(ctx.args.warmup):
            _one_step(ctx, k, step_fn, losses)
        dist.barrier(group=ctx.meta_group)  # line the ranks up before the traced window
        # phase: profiled steps, one ProfilerStep#<n> each
        with capture.profile_steps(ctx.run, ctx.rank, ctx.args.steps, ctx.device.type) as prof:
            for k in range(ctx.args.warmup, ctx.total_steps):
                _one_step(ctx, k, step_fn, losses)
                prof.step()
    except BaseException as exc:
        capture.dump_flight_recorder(ctx.run, ctx.rank)  # most useful exactly when something broke
        if isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM:
            # stopped (timeout, a peer died): the trace is written; leave now, since tearing down
            # a process group whose peers are blocked can wait forever and keeps them blocked
            _log(f"[{ctx.strategy}] rank {ctx.rank} stopped by SIGTERM; trace written")
            os._exit(exc.code)
        raise
    return losses


def _straggler_record(ctx: Context) -> dict[str, Any] | None:
    """run.json ``straggler`` (docs/run-folder.md): the straggler rank's injected seconds per
    step, sent to rank 0 (a collective: every rank calls it); None without ``--straggler``."""
    if ctx.args.straggler is None:
        return None
    slow_rank, factor = options.parse_straggler(ctx.args.straggler)
    box: list[Any] = [ctx.straggler.injected if ctx.straggler is not None else None]
    dist.broadcast_object_list(box, src=slow_rank, group=ctx.meta_group)
    injected: dict[int, float] = box[0] or {}
    w = ctx.args.warmup
    return {
        "rank": slow_rank,
        "factor": factor,
        # one entry per profiled step (the trace's steps), then the warm-up steps' apart
        "injected_s": [injected.get(k, 0.0) for k in range(w, ctx.total_steps)],
        "warmup_injected_s": [injected.get(k, 0.0) for k in range(w)],
    }


def finish(
    ctx: Context,
    losses: list[float | None],
    params: dict[str, torch.Tensor] | None = None,
    train_extra: dict[str, Any] | None = None,
) -> None:
    """Write train/, memory/, flight recorder; rank 0 marks run.json ok; leave the group cleanly.

    train_extra: more keys for train/rank<R>.json (a strategy's own log)."""
    for action in ctx.finishers:
        action()
    w = ctx.args.warmup
    if ctx.memory is not None:
        for meter in ctx.step_meters:
            ctx.memory.update(meter.memory(w))
    capture.write_train(
        ctx.run,
        ctx.rank,
        losses,
        step_times_s=ctx.step_times,
        profiled=[k >= w for k in range(len(losses))],
        warmup=w,
        steps=ctx.args.steps,
        **(train_extra or {}),
    )
    if ctx.memory is not None:
        capture.write_memory(ctx.run, ctx.rank, ctx.memory)
    if params is not None and os.environ.get("TRACEKIT_SAVE_PARAMS") == "1":
        capture.save_params(ctx.run, ctx.rank, params)
    capture.dump_flight_recorder(ctx.run, ctx.rank)
    planted = _straggler_record(ctx)
    dist.barrier(group=ctx.meta_group)  # every rank's files are written before "ok"
    if ctx.rank == 0:
        data = runfolder.load_run_json(ctx.run) or _run_json(ctx, ctx.topology, "running")
        data["config"]["strategy_options"] = ctx.strategy_options
        if planted is not None:
            data["straggler"] = planted
        if data.get("status") == "running":  # a final status (the launcher's) is never undone
            data["status"] = "ok"
            runfolder.write_json_atomic(runfolder.run_json_path(ctx.run), data)
        _log(f"[{ctx.strategy}] done: {ctx.run}")
    # destroyed and freed now, so no gloo worker still runs when Python finalises (the abort
    # at exit of issue #25: tracekit.capture.teardown); the context's references go too
    ctx.group = ctx.meta_group = None  # type: ignore[assignment]
    capture.leave_process_group()


def run(
    ctx: Context,
    train_step: Callable[[torch.Tensor, torch.Tensor], float | None],
    params: Callable[[], dict[str, torch.Tensor]],
    shard: tuple[int, int] | None = None,
) -> None:
    """The end of a strategy's ``main``: :func:`train` with ``train_step(tokens, targets)`` on
    each step's batch, then :func:`finish` with the final parameters, ``params()``.

    ``shard``: (data-parallel rank, data-parallel size): the rank trains on its contiguous slice
    of the global batch; None: on the whole batch (tensor and pipeline parallelism)."""

    def step(k: int) -> float | None:
        tokens, targets = ctx.batch(k) if shard is None else ctx.dp_batch(k, *shard)
        return train_step(tokens, targets)

    finish(ctx, train(ctx, step), params=params())


def entrypoint(main: Callable[[], None]) -> None:
    """Run ``main`` so that torchrun records a rank's exception in its error file.

    A rank that raised leaves with ``os._exit(1)`` once the traceback is printed: interpreter
    teardown destroys the process group, which can block forever when a peer is gone or stuck.
    """
    import traceback

    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        record(main)()
    except Exception:  # noqa: BLE001 - recorded by `record`; shown here; SystemExit passes
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
