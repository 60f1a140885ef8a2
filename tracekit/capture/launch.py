"""`tracekit run`: validate the options, start torchrun, watch it, finalise run.json.

    run_job(RunOptions("dp", nproc=2, steps=3)) -> Path of the run folder

The ranks run as ``python -m tracekit.capture.torchrun_agent torch.distributed.run --standalone
--nproc-per-node N --log-dir <run>/logs/torchrun --tee 3 -m <strategy module> --run-dir <run>
...`` in a session of their own; their output is copied to ``log`` (stderr) and to
``<run>/logs/launcher.log``, and afterwards each rank's stdout, stderr and error file are moved
to ``<run>/logs/rank<R>.*``.
A rank that raises leaves torchrun's error file (the strategies' entry points use
``torch.distributed.elastic...errors.record``); the launcher turns those, and torchrun's failure
summary for ranks killed by a signal, into run.json ``errors`` with status "failed". On
``timeout`` every process of the job is killed and the status is "timeout"; Ctrl-C, SIGTERM and
SIGHUP kill them too, with status "interrupted" (a second signal only shortens the grace). Every
process of the job carries a token in its environment (supervise.JOB_ENV), by which the launcher
finds and stops exactly its own, even ranks whose torchrun was killed; torchrun dies with the
launcher and each rank with its torchrun (PR_SET_PDEATHSIG); torchrun outlives a killed
launcher by at most supervise.KILL_GRACE_S (``AGENT``: torchrun can hang at exit). The launcher
writes the final status once, after the last process of the job is gone; a rank never turns it
into "ok".
If rank 0 never wrote run.json the launcher writes it; traces that did get written are kept.

``--emulate-network`` (tracekit.capture.netns): every node's torchrun agent runs inside a network
namespace of its own, ``ip netns exec tk<pid>n<k> python -m tracekit.capture.torchrun_agent
torch.distributed.run --nnodes K --rdzv-backend c10d --rdzv-endpoint <node 0's address>:29400
--local-addr <node k's address> --nproc-per-node N/K ...``, a real multi-node rendezvous, with
logs in logs/torchrun/node<k>/.
If one node's agent fails, the others get ``PEER_GRACE_S`` to notice, then are stopped. The
namespaces are removed in a ``finally``; SIGTERM and SIGHUP to the launcher become an exception
(``Terminated``, like Ctrl-C) so that it runs; leftovers of a launcher killed outright are swept
by the next emulated run.

What a strategy is and which options it takes: tracekit.strategies.registry and
tracekit.strategies.options (RunOptions); processes: tracekit.capture.supervise; how the job
ended, in run.json: tracekit.capture.outcome.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tracekit import runfolder
from tracekit.capture import outcome, supervise
from tracekit.capture.supervise import Terminated
from tracekit.errors import TracekitError
from tracekit.strategies import registry
from tracekit.strategies.options import RunOptions, backend_of, problem, rank_args

AGENT = "tracekit.capture.torchrun_agent"  # torchrun's main, bounded after the launcher's death

__all__ = ["RunOptions", "run_job", "validate"]


def validate(opts: RunOptions) -> registry.Strategy:
    """The strategy, or a one-line TracekitError naming the bad option."""
    spec = registry.get(opts.strategy)
    if spec is None:
        raise TracekitError(
            f"unknown strategy {opts.strategy!r}; known: {', '.join(sorted(registry.STRATEGIES))}"
        )
    why = problem(spec, opts)
    if why:
        raise TracekitError(why)
    if opts.nproc % opts.nodes:
        raise TracekitError(f"--nproc {opts.nproc} does not divide by --nodes {opts.nodes}")
    why = spec.layout_problem(opts.nproc, opts.nodes)
    if why:
        raise TracekitError(why)
    why = _batch_problem(spec, opts) or _tensor_parallel_problem(spec, opts)
    if why:  # the ranks check it too, but a rank refusing leaves its peers to abort
        raise TracekitError(why)
    if opts.device == "cuda":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found == 0:
            raise TracekitError("--device cuda asked, but this machine has no usable GPU")
        # NCCL needs a GPU per rank; gloo ranks may share one (rank r uses GPU r mod found)
        if opts.nproc > found and backend_of(opts) == "nccl":
            raise TracekitError(
                f"--nproc {opts.nproc} with nccl needs {opts.nproc} GPUs, this machine has "
                f"{found} (gloo ranks can share a GPU: --backend gloo)"
            )
    from tracekit.capture import netns

    netns.rate_bits(opts.inter_node_bandwidth)  # a TracekitError unless it is a tc rate
    if opts.emulate_network:
        reason = netns.unavailable()
        if reason:
            raise TracekitError(reason)
        if opts.nodes > netns.MAX_NODES:
            raise TracekitError(f"--emulate-network supports at most {netns.MAX_NODES} nodes")
    return spec


def _batch_problem(spec: registry.Strategy, opts: RunOptions) -> str | None:
    """Why the global batch does not split over the ranks or the microbatches (the checks the
    run side's harness and pipeline runner make in each rank), or None."""
    batch = opts.global_batch or spec.global_batch
    if spec.splits_batch and batch % opts.nproc:
        return f"--global-batch {batch} does not divide by {opts.nproc} ranks"
    if spec.schedule is not None:
        m = opts.microbatches or 2 * opts.nproc  # the pipelines' default: m = 2 x stages
        if batch % m:
            how = "--microbatches" if opts.microbatches else f"the default 2 x {opts.nproc} stages"
            return (
                f"--global-batch {batch} does not divide into {m} microbatches ({how}); "
                "give --microbatches M with M dividing it, or another --nproc"
            )
    return None


def _tensor_parallel_problem(spec: registry.Strategy, opts: RunOptions) -> str | None:
    """Why the model's heads or MLP width do not split over the tensor-parallel group (tp: all
    the ranks; tp-dp: the ranks of one node), which the ranks would find only when they build
    the model (the run side's tensor-parallel strategy), or None."""
    if spec.module not in ("tp", "tp_dp"):
        return None
    from tracekit.strategies.model_shape import GPTConfig

    cfg, t = GPTConfig(), opts.nproc // opts.nodes
    where = "ranks" if spec.module == "tp" else "ranks per node"
    if cfg.n_heads % t or (4 * cfg.d_model) % t:
        return (
            f"{spec.name}: the model's {cfg.n_heads} attention heads (and MLP width "
            f"{4 * cfg.d_model}) do not split over {t} tensor-parallel {where}: use a "
            f"divisor of {cfg.n_heads}"
        )
    return None


# --- the job ------------------------------------------------------------------------------------


def _child_env(opts: RunOptions, run: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, **(extra or {}))
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    root = str(
        Path(__file__).resolve().parents[2]
    )  # the repository: tracekit and the strategy package
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    if backend_of(opts) == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,TUNING")
        env.setdefault("NCCL_DEBUG_FILE", str(runfolder.nccl_dir(run) / "%h.%p.log"))
    return env


def _commands(
    opts: RunOptions, spec: registry.Strategy, run: Path, net: Any
) -> list[tuple[list[str], dict[str, str]]]:
    """(command, environment) of each torchrun agent: one standalone agent, or one per emulated node."""
    logs = outcome.logs_dir(run)
    module_args = ["-m", spec.entry, "--run-dir", str(run), *rank_args(opts)]
    if net is None:
        return [
            (
                [
                    sys.executable,
                    "-m",
                    AGENT,
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    str(opts.nproc),
                    "--log-dir",
                    str(logs / "torchrun"),
                    "--tee",
                    "3",
                    *module_args,
                ],
                _child_env(opts, run),
            )
        ]
    run_id = f"tk{os.getpid()}-{run.name}"
    return [
        (
            net.wrap(
                k,
                [
                    sys.executable,
                    "-m",
                    AGENT,
                    "torch.distributed.run",
                    *net.torchrun_args(k, run_id),
                    "--nproc-per-node",
                    str(opts.nproc // opts.nodes),
                    "--log-dir",
                    str(logs / "torchrun" / f"node{k}"),
                    "--tee",
                    "3",
                    *module_args,
                ],
            ),
            _child_env(opts, run, net.env(k, backend_of(opts))),
        )
        for k in range(opts.nodes)
    ]


def run_job(opts: RunOptions, log: supervise.Sink = sys.stderr) -> Path:
    """Run one strategy job; return its run folder (run.json ``status`` tells how it went)."""
    spec = validate(opts)
    hurry = threading.Event()

    def terminate(signum: int, frame: object) -> None:
        # the first signal stops the job; later ones (a second Ctrl-C, timeout's re-sent
        # SIGINT) only cut the grace short: they never interrupt the stopping half-way
        supervise.hurry_on_signals(hurry)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    previous = supervise.on_signals(terminate, terminate)
    net = None
    try:
        if opts.emulate_network:  # first, so that a failure leaves no half-made run folder
            from tracekit.capture.netns import EmulatedNetwork

            net = EmulatedNetwork(opts.nodes, opts.inter_node_bandwidth).open()
        run = runfolder.new_run_dir(
            Path(opts.out), opts.strategy, time.strftime("%Y%m%d-%H%M%S")
        ).resolve()
        outcome.logs_dir(run).mkdir(parents=True, exist_ok=True)
        if backend_of(opts) == "nccl":
            runfolder.nccl_dir(run).mkdir(parents=True, exist_ok=True)
        return _run_agents(opts, spec, run, net, log, hurry)
    finally:
        if net is not None:
            net.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_agents(
    opts: RunOptions,
    spec: registry.Strategy,
    run: Path,
    net: Any,
    log: supervise.Sink,
    hurry: threading.Event,
) -> Path:
    logs = outcome.logs_dir(run)
    token = secrets.token_hex(8)  # marks every process of this job: we stop those, and only those
    commands = [(c, {**e, supervise.JOB_ENV: token}) for c, e in _commands(opts, spec, run, net)]
    cmd = commands[0][0] if len(commands) == 1 else [c for c, _ in commands]
    where = (
        f" on {opts.nodes} emulated nodes ({opts.inter_node_bandwidth} between them)" if net else ""
    )
    print(f"tracekit: {opts.strategy} on {opts.nproc} ranks{where} -> {run}", file=log, flush=True)
    t0 = time.monotonic()
    status, errors = "ok", []
    output_lines: list[str] = []
    launch_info = {
        "emulate_network": opts.emulate_network,
        "inter_node_bandwidth": opts.inter_node_bandwidth,
        "network": net.describe() if net is not None else None,
    }
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    me = os.getpid()
    with open(logs / "launcher.log", "w") as log_file:
        sinks: list[supervise.Sink] = [log, log_file]
        try:
            for command, env in commands:
                proc = subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                    start_new_session=True,
                    # torchrun dies with us (SIGTERM: it stops its ranks), even if we are killed
                    preexec_fn=lambda: supervise.die_with_parent(signal.SIGTERM, me),
                )
                procs.append(proc)
                pump = threading.Thread(
                    target=supervise.pump,
                    args=(proc.stdout, sinks, output_lines),
                    daemon=True,
                )
                pump.start()
                pumps.append(pump)
            supervise.wait_all(procs, opts.timeout, token)
        except subprocess.TimeoutExpired:
            supervise.hurry_on_signals(hurry)  # Ctrl-C now: the stop goes on, only sooner
            stopped = [e for proc in procs for e in supervise.kill_job(proc, token, hurry)]
            status = "timeout"
            errors.append(
                {
                    "rank": None,
                    "kind": "timeout",
                    "message": f"job killed after the {opts.timeout:g} s timeout",
                }
            )
            errors += stopped
        except KeyboardInterrupt as exc:
            supervise.hurry_on_signals(hurry)  # (already, unless it came from elsewhere)
            # torchrun answers our SIGTERM with a 25-line traceback: logs/ keeps it, not the
            # terminal, where the one line is `tracekit: interrupted`
            sinks.remove(log)
            for proc in procs:
                supervise.kill_job(proc, token, hurry)
            supervise.kill_job(None, token, hurry)  # ranks that outlived a dead torchrun
            for pump in pumps:
                pump.join(timeout=2)
            how = (
                f"interrupted ({exc.args[0]})"
                if isinstance(exc, Terminated)
                else "interrupted (Ctrl-C)"
            )
            outcome.finalise(
                opts,
                run,
                "interrupted",
                [{"rank": None, "kind": "interrupted", "message": how}],
                {
                    "command": cmd,
                    "returncode": [p.returncode for p in procs]
                    if net
                    else (procs[0].returncode if procs else None),
                    "wall_s": time.monotonic() - t0,
                    **launch_info,
                },
            )
            raise
        for pump in pumps:
            pump.join(timeout=5)
    codes = [p.returncode for p in procs]
    rc = next((c for c in codes if c), 0)
    # torchrun gone but ranks of ours alive (it was killed: they die with it, PDEATHSIG, unless
    # the kernel has no such thing): stopped now, before run.json is written, so no rank is
    # left to write it after us
    orphans = supervise.kill_job(None, token)
    rank_errors = outcome.rank_errors(
        run, "".join(output_lines), opts.nproc // opts.nodes if net else 0
    )
    if status == "ok" and rc != 0:
        status = "failed"
        errors = rank_errors or [{"rank": None, "kind": "exit", "message": outcome.agent_exit(rc)}]
        errors += orphans
    elif status == "timeout":
        errors += rank_errors
    wall = time.monotonic() - t0
    outcome.finalise(
        opts,
        run,
        status,
        errors,
        {
            "command": cmd,
            "returncode": codes if net else rc,
            "wall_s": round(wall, 3),
            "timeout_s": opts.timeout,
            **launch_info,
        },
    )
    print(f"tracekit: {opts.strategy} {status} in {wall:.1f} s", file=log, flush=True)
    return run
