"""`tracekit run`: validate the options, start torchrun, watch it, finalise run.json.

    run_job(RunOptions("dp", nproc=2, steps=3)) -> Path of the run folder

The ranks run as ``python -m torch.distributed.run --standalone --nproc-per-node N
--log-dir <run>/logs/torchrun --tee 3 -m <strategy module> --run-dir <run> ...`` in a session of
their own; their output is copied to ``log`` (stderr) and to ``<run>/logs/launcher.log``, and
afterwards each rank's stdout, stderr and error file are moved to ``<run>/logs/rank<R>.*``.
A rank that raises leaves torchrun's error file (the strategies' entry points use
``torch.distributed.elastic...errors.record``); the launcher turns those, and torchrun's failure
summary for ranks killed by a signal, into run.json ``errors`` with status "failed". On
``timeout`` every process of the job is killed and the status is "timeout"; Ctrl-C, SIGTERM and
SIGHUP kill them too, with status "interrupted".
If rank 0 never wrote run.json the launcher writes it; traces that did get written are kept.

``--emulate-network`` (tracekit.netns): every node's torchrun agent runs inside a network
namespace of its own, ``ip netns exec tk<pid>n<k> python -m torch.distributed.run --nnodes K
--rdzv-backend c10d --rdzv-endpoint <node 0's address>:29400 --local-addr <node k's address>
--nproc-per-node N/K ...``, a real multi-node rendezvous, with logs in logs/torchrun/node<k>/.
If one node's agent fails, the others get ``_PEER_GRACE_S`` to notice, then are stopped. The
namespaces are removed in a ``finally``; SIGTERM and SIGHUP to the launcher become an exception
(``Terminated``, like Ctrl-C) so that it runs; leftovers of a launcher killed outright are swept
by the next emulated run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tracekit import runfolder
from tracekit.errors import TracekitError

OPTIONAL_OPTIONS = ("microbatches", "prefetch")
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_KILL_GRACE_S = 5.0
_PEER_GRACE_S = 20.0  # emulated nodes: time the others get to exit after one node's agent failed


class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP to the launcher: handled like Ctrl-C (the job is stopped, run.json written)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class StrategySpec:
    """How to start a strategy and which optional options it uses."""

    module: str
    uses: frozenset[str] = frozenset()
    precisions: frozenset[str] = frozenset({"fp32"})
    # "module:function" (world_size, nodes) -> why the layout cannot run, or None: checked
    # before launching, so a bad layout is one line and exit 2, not a failed run (a name, not
    # the function: the strategy modules import torch, which `tracekit analyze` never needs)
    layout: str | None = None

    def layout_problem(self, world_size: int, nodes: int) -> str | None:
        if self.layout is None:
            return None
        import importlib

        module, function = self.layout.split(":")
        return getattr(importlib.import_module(module), function)(world_size, nodes)


STRATEGIES: dict[str, StrategySpec] = {
    "dp": StrategySpec("instrumented_runs.dp", precisions=frozenset({"fp32", "bf16-mixed"})),
    "pp-gpipe": StrategySpec(
        "instrumented_runs.pp_gpipe",
        uses=frozenset({"microbatches"}),
        layout="instrumented_runs.pipeline:check_layout",
    ),
    "pp-1f1b": StrategySpec(
        "instrumented_runs.pp_1f1b",
        uses=frozenset({"microbatches"}),
        layout="instrumented_runs.pipeline:check_layout",
    ),
    "pp-pipedream": StrategySpec(
        "instrumented_runs.pp_pipedream",
        uses=frozenset({"microbatches"}),
        layout="instrumented_runs.pipeline:check_layout",
    ),
    "zero1": StrategySpec("instrumented_runs.zero1", precisions=frozenset({"fp32", "bf16-mixed"})),
    "zero2": StrategySpec("instrumented_runs.zero2", precisions=frozenset({"fp32", "bf16-mixed"})),
    "zero3": StrategySpec(
        "instrumented_runs.zero3",
        uses=frozenset({"prefetch"}),
        precisions=frozenset({"fp32", "bf16-mixed"}),
    ),
    "tp": StrategySpec("instrumented_runs.tp", precisions=frozenset({"fp32", "bf16-mixed"})),
    "tp-dp": StrategySpec("instrumented_runs.tp_dp", precisions=frozenset({"fp32", "bf16-mixed"})),
    "fsdp": StrategySpec(
        "instrumented_runs.fsdp",
        uses=frozenset({"prefetch"}),
        precisions=frozenset({"fp32", "bf16-mixed"}),
    ),
    "hsdp": StrategySpec(
        "instrumented_runs.hsdp",
        uses=frozenset({"prefetch"}),
        precisions=frozenset({"fp32", "bf16-mixed"}),
        layout="instrumented_runs.hsdp:check_layout",
    ),
}


@dataclass
class RunOptions:
    strategy: str
    nproc: int = 2
    nodes: int = 1
    steps: int = 3
    warmup: int = 1
    microbatches: int | None = None
    precision: str = "fp32"
    prefetch: int | None = None
    device: str = "cpu"
    backend: str | None = None
    timeout: float | None = None
    emulate_network: bool = False
    inter_node_bandwidth: str = "1gbit"
    out: Path = field(default=Path("runs"))


# --- validation ---------------------------------------------------------------------------------


def validate(opts: RunOptions) -> StrategySpec:
    """The strategy's spec, or a one-line TracekitError naming the bad option."""
    spec = STRATEGIES.get(opts.strategy)
    if spec is None:
        raise TracekitError(
            f"unknown strategy {opts.strategy!r}; known: {', '.join(sorted(STRATEGIES))}"
        )
    for name in OPTIONAL_OPTIONS:
        if getattr(opts, name) is not None and name not in spec.uses:
            raise TracekitError(f"--{name} is not used by {opts.strategy}")
    if opts.nproc < 1 or opts.nodes < 1:
        raise TracekitError("--nproc and --nodes must be at least 1")
    if opts.nproc % opts.nodes:
        raise TracekitError(f"--nproc {opts.nproc} does not divide by --nodes {opts.nodes}")
    problem = spec.layout_problem(opts.nproc, opts.nodes)
    if problem:
        raise TracekitError(problem)
    if opts.steps < 1 or opts.warmup < 0:
        raise TracekitError("--steps must be at least 1 and --warmup at least 0")
    if opts.microbatches is not None and opts.microbatches < 1:
        raise TracekitError("--microbatches must be at least 1")
    if opts.prefetch is not None and opts.prefetch not in (0, 1, 2):
        raise TracekitError("--prefetch must be 0, 1 or 2")
    if opts.precision not in ("fp32", "bf16-mixed"):
        raise TracekitError(f"--precision must be fp32 or bf16-mixed, not {opts.precision!r}")
    if opts.precision not in spec.precisions:
        raise TracekitError(
            f"--precision {opts.precision} is not supported for {opts.strategy} yet"
        )
    if opts.device not in ("cpu", "cuda"):
        raise TracekitError(f"--device must be cpu or cuda, not {opts.device!r}")
    if opts.backend not in (None, "gloo", "nccl"):
        raise TracekitError(f"--backend must be gloo or nccl, not {opts.backend!r}")
    if opts.backend == "nccl" and opts.device != "cuda":
        raise TracekitError("--backend nccl needs --device cuda")
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
    if opts.timeout is not None and opts.timeout <= 0:
        raise TracekitError("--timeout must be a positive number of seconds")
    if not _RATE.match(str(opts.inter_node_bandwidth)):
        raise TracekitError(
            f"--inter-node-bandwidth {opts.inter_node_bandwidth!r} is not a tc rate such as 400mbit or 1gbit"
        )
    if opts.emulate_network:
        from tracekit import netns

        reason = netns.unavailable()
        if reason:
            raise TracekitError(reason)
        if opts.nodes > netns.MAX_NODES:
            raise TracekitError(f"--emulate-network supports at most {netns.MAX_NODES} nodes")
    return spec


def backend_of(opts: RunOptions) -> str:
    return opts.backend or ("nccl" if opts.device == "cuda" else "gloo")


def _rank_args(opts: RunOptions, run: Path) -> list[str]:
    args = [
        "--run-dir",
        str(run),
        "--steps",
        str(opts.steps),
        "--warmup",
        str(opts.warmup),
        "--precision",
        opts.precision,
        "--device",
        opts.device,
        "--backend",
        backend_of(opts),
        "--nodes",
        str(opts.nodes),
    ]
    if opts.microbatches is not None:
        args += ["--microbatches", str(opts.microbatches)]
    if opts.prefetch is not None:
        args += ["--prefetch", str(opts.prefetch)]
    return args


# --- processes ----------------------------------------------------------------------------------


def _logs_dir(run: Path) -> Path:
    return Path(run) / "logs"


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    """The same process (same start time) still exists and is not a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[19] == start and fields[0] not in ("Z", "X")


def _descendants(root: int) -> list[tuple[int, str | None]]:
    """(pid, start time) of every live descendant of ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append((child, _proc_start_time(child)))
            todo.append(child)
    return found


def _signal(pid: int, sig: int, start: str | None = None) -> None:
    """Signal a process (its whole group when it leads one), if it is still the same process."""
    if start is not None and _proc_start_time(pid) != start:
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _env_rank(pid: int) -> int | None:
    """RANK in a live process's environment (torchrun sets it for each rank), else None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK=") and item[5:].isdigit():
            return int(item[5:])
    return None


def _kill_job(proc: subprocess.Popen) -> list[dict[str, Any]]:
    """SIGTERM torchrun and every rank (each in a session of its own); SIGKILL what is left after
    a grace period (ranks use it to write what their profiler recorded). Returns one run.json
    error per rank that was still running: stopped by SIGTERM, or killed after the grace."""
    members = [(proc.pid, _proc_start_time(proc.pid)), *_descendants(proc.pid)]
    ranks = {pid: _env_rank(pid) for pid, _ in members}
    for pid, start in members:
        _signal(pid, signal.SIGTERM, start)
    deadline = time.monotonic() + _KILL_GRACE_S
    while time.monotonic() < deadline and any(_alive(p, s) for p, s in members):
        proc.poll()  # reap torchrun so that its pid does not linger as a zombie
        time.sleep(0.05)
    stubborn = {pid for pid, start in members if _alive(pid, start)}
    for pid, start in members:
        _signal(pid, signal.SIGKILL, start)
    proc.wait()
    return [
        {
            "rank": r,
            "kind": "stopped",
            "message": "still running when the job was stopped: "
            + (
                f"killed (SIGKILL) after ignoring SIGTERM for {_KILL_GRACE_S:g} s"
                if pid in stubborn
                else "exited on SIGTERM"
            ),
        }
        for pid, r in sorted(ranks.items(), key=lambda kv: kv[1] if kv[1] is not None else -1)
        if r is not None
    ]


def _pump(stream: TextIO, sinks: list[TextIO], keep: list[str]) -> None:
    """Copy the job's output, line by line, to every sink and keep it for parsing."""
    for line in stream:
        keep.append(line)
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass


# --- errors and run.json ------------------------------------------------------------------------

_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n"
    r"\s*error_file:\s*(?P<file>[^\n]*)\n\s*traceback\s*:\s*(?P<tb>[^\n]*)"
)


_ROOT_CAUSE = re.compile(
    r"Root Cause[^\n]*\n\[\d+\]:\n(?:[^\n]*\n){0,3}?\s*rank\s*:\s*(?P<rank>\d+)"
)


def _collect_rank_logs(run: Path, per_node: int = 0) -> dict[int, dict[str, Any]]:
    """Move torchrun's per-rank files to logs/rank<R>.*; return the error files' contents by rank."""
    logs = _logs_dir(run)
    errors: dict[int, dict[str, Any]] = {}
    found = [(0, d) for d in (logs / "torchrun").glob("*/attempt_*/*")]
    found += [
        (int(d.parents[2].name[4:]), d)
        for d in (logs / "torchrun").glob("node*/*/attempt_*/*")
        if d.parents[2].name[4:].isdigit()
    ]
    for node, rank_dir in sorted(found, key=lambda x: (x[0], str(x[1]))):
        if not rank_dir.name.isdigit():
            continue
        # standalone: local rank == global rank; emulated node k: ranks k*per_node.. (contiguous)
        rank = node * per_node + int(rank_dir.name)
        for name in ("stdout.log", "stderr.log", "error.json"):
            src = rank_dir / name
            if src.is_file():
                dst = logs / f"rank{rank}.{name}"  # logs/rank1.stderr.log, logs/rank1.error.json
                shutil.move(str(src), dst)
                if name == "error.json":
                    try:
                        errors[rank] = json.loads(dst.read_text())
                    except (OSError, ValueError):
                        errors[rank] = {}
    shutil.rmtree(logs / "torchrun", ignore_errors=True)
    return errors


def _error_message(content: dict[str, Any]) -> str:
    msg = content.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message")
    return str(msg) if msg else "the rank raised (no message in its error file)"


_COLLATERAL = re.compile(
    r"Connection (closed|reset) by peer|remote worker crash|Broken pipe", re.IGNORECASE
)


def _error_time(content: dict[str, Any]) -> float:
    try:
        return float(content["message"]["extraInfo"]["timestamp"])
    except (KeyError, TypeError, ValueError):
        return float("inf")


def _rank_errors(run: Path, output: str, per_node: int = 0) -> list[dict[str, Any]]:
    """run.json errors, the root cause first: raised exceptions (error files, oldest first), then
    ranks torchrun saw die otherwise. A peer's "Connection closed by peer" is usually collateral."""
    files = _collect_rank_logs(run, per_node)
    root = _ROOT_CAUSE.search(output)
    root_rank = (
        int(root["rank"])
        if root
        else min(files, key=lambda r: (_error_time(files[r]), r), default=None)
    )
    # torchrun names the oldest error file, but a peer's collateral failure can be written before
    # the failing rank's own (that one first exports its trace): prefer a rank's own exception
    own = [r for r in files if not _COLLATERAL.search(_error_message(files[r]))]
    if own and (root_rank not in own):
        root_rank = min(own, key=lambda r: (_error_time(files[r]), r))
    order = sorted(files, key=lambda r: (r != root_rank, _error_time(files[r]), r))
    errors = [
        {
            "rank": r,
            "kind": "exception",
            "message": _error_message(files[r]),
            "root_cause": r == root_rank,
        }
        for r in order
    ]
    seen = set(files)
    for m in _FAILURE.finditer(output):
        rank, code = int(m["rank"]), int(m["code"])
        if rank in seen:
            continue
        seen.add(rank)
        signum = (
            -code if code < 0 else code - 128 if code > 128 else 0
        )  # harness: SIGTERM -> exit 143
        if signum in signal.Signals._value2member_map_:
            errors.append(
                {
                    "rank": rank,
                    "kind": "signal",
                    "root_cause": rank == root_rank,
                    "message": f"stopped by {signal.Signals(signum).name} (exit status {code})",
                }
            )
        else:
            errors.append(
                {
                    "rank": rank,
                    "kind": "exit",
                    "message": f"exit status {code}",
                    "root_cause": rank == root_rank,
                }
            )
    errors.sort(key=lambda e: not e["root_cause"])  # stable: the root cause first
    return errors


def _fallback_run_json(opts: RunOptions, run: Path, quick: bool = False) -> dict[str, Any]:
    """run.json when rank 0 never wrote one: what the launcher knows. ``quick`` (interrupted):
    without importing torch (tracekit.capture), which takes seconds on a busy machine; the
    versions then come from the installed packages' metadata and the environment is unknown."""
    if quick and "tracekit.capture" not in sys.modules:
        import platform
        from importlib import metadata

        import tracekit

        try:
            torch_version: str | None = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
        versions = {
            "python": platform.python_version(),
            "torch": torch_version,
            "tracekit": tracekit.__version__,
        }
        environment = None
    else:
        from tracekit import capture

        versions, environment = capture.versions(), capture.environment(threads_per_rank=1)
    per_node = opts.nproc // opts.nodes
    host = socket.gethostname()
    config = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in asdict(opts).items()
        if k != "strategy"
    }
    return {
        "schema_version": runfolder.RUN_SCHEMA_VERSION,
        "strategy": opts.strategy,
        "config": config,
        "world_size": opts.nproc,
        "backend": backend_of(opts),
        "device": opts.device,
        "precision": opts.precision,
        "versions": versions,
        "environment": environment,
        "topology": [
            {"rank": r, "node": r // per_node, "host": host, "local_rank": r}
            for r in range(opts.nproc)
        ],
        "status": "failed",
        "errors": [],
    }


def _finalise(
    opts: RunOptions, run: Path, status: str, errors: list[dict[str, Any]], launch: dict[str, Any]
) -> None:
    for folder in (runfolder.traces_dir(run), runfolder.nccl_dir(run)):
        for tmp in folder.glob(
            ".*.tmp*"
        ):  # a rank killed while exporting leaves its temporary file
            tmp.unlink(missing_ok=True)
    try:
        data = runfolder.load_run_json(run)
    except TracekitError:
        data = None
    if data is None:
        data = _fallback_run_json(opts, run, quick=status == "interrupted")
        if status == "ok":
            status = "failed"
            errors = [
                *errors,
                {"rank": 0, "kind": "missing", "message": "rank 0 never wrote run.json"},
            ]
    data["status"] = status
    data["errors"] = [*data.get("errors", []), *errors]
    data["launch"] = launch
    runfolder.write_json_atomic(runfolder.run_json_path(run), data)


# --- the job ------------------------------------------------------------------------------------


def _child_env(opts: RunOptions, run: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, **(extra or {}))
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    root = str(Path(__file__).resolve().parents[1])  # where tracekit and instrumented_runs live
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    if backend_of(opts) == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,TUNING")
        env.setdefault("NCCL_DEBUG_FILE", str(runfolder.nccl_dir(run) / "%h.%p.log"))
    return env


def _commands(
    opts: RunOptions, spec: StrategySpec, run: Path, net: Any
) -> list[tuple[list[str], dict[str, str]]]:
    """(command, environment) of each torchrun agent: one standalone agent, or one per emulated node."""
    logs = _logs_dir(run)
    rank_args = ["-m", spec.module, *_rank_args(opts, run)]
    if net is None:
        return [
            (
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    str(opts.nproc),
                    "--log-dir",
                    str(logs / "torchrun"),
                    "--tee",
                    "3",
                    *rank_args,
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
                    "torch.distributed.run",
                    *net.torchrun_args(k, run_id),
                    "--nproc-per-node",
                    str(opts.nproc // opts.nodes),
                    "--log-dir",
                    str(logs / "torchrun" / f"node{k}"),
                    "--tee",
                    "3",
                    *rank_args,
                ],
            ),
            _child_env(opts, run, net.env(k, backend_of(opts))),
        )
        for k in range(opts.nodes)
    ]


def _wait_all(procs: list[subprocess.Popen], timeout: float | None) -> None:
    """Wait for every agent; raise TimeoutExpired after ``timeout`` s. When one exits with an
    error, the others (other emulated nodes) get _PEER_GRACE_S to follow, then are stopped.
    Polls every 0.1 s: a blocking waitpid under a SIGINT handler with SA_RESTART never comes
    back to Python for Ctrl-C."""
    t0, failed_at = time.monotonic(), None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if timeout is not None and now - t0 > timeout:
            raise subprocess.TimeoutExpired(procs[0].args, timeout)
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = now
        if failed_at is not None and now - failed_at > _PEER_GRACE_S:
            for p in procs:
                if p.poll() is None:
                    _kill_job(p)
        time.sleep(0.1)


def _on_signals(handler: Any) -> dict[int, Any]:
    """Install ``handler`` for SIGTERM and SIGHUP, and Python's own for SIGINT (main thread
    only); the previous handlers.

    SIGINT too: importing polars installs a SIGINT handler of its own with SA_RESTART, under
    which Ctrl-C never interrupted waiting for the job (signal.signal installs without it). The
    wait itself also polls (_wait_all), so a handler installed later cannot block it either.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    return previous


def run_job(opts: RunOptions, log: TextIO = sys.stderr) -> Path:
    """Run one strategy job; return its run folder (run.json ``status`` tells how it went)."""
    spec = validate(opts)

    def terminate(signum: int, frame: object) -> None:
        raise Terminated(signum)

    previous = _on_signals(terminate)
    net = None
    try:
        if opts.emulate_network:  # first, so that a failure leaves no half-made run folder
            from tracekit.netns import EmulatedNetwork

            net = EmulatedNetwork(opts.nodes, opts.inter_node_bandwidth).open()
        run = runfolder.new_run_dir(
            Path(opts.out), opts.strategy, time.strftime("%Y%m%d-%H%M%S")
        ).resolve()
        _logs_dir(run).mkdir(parents=True, exist_ok=True)
        if backend_of(opts) == "nccl":
            runfolder.nccl_dir(run).mkdir(parents=True, exist_ok=True)
        return _run_agents(opts, spec, run, net, log)
    finally:
        if net is not None:
            net.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_agents(opts: RunOptions, spec: StrategySpec, run: Path, net: Any, log: TextIO) -> Path:
    logs = _logs_dir(run)
    commands = _commands(opts, spec, run, net)
    cmd = commands[0][0] if len(commands) == 1 else [c for c, _ in commands]
    where = (
        f" on {opts.nodes} emulated nodes ({opts.inter_node_bandwidth} between them)" if net else ""
    )
    print(f"tracekit: {opts.strategy} on {opts.nproc} ranks{where} -> {run}", file=log, flush=True)
    t0 = time.monotonic()
    status, errors, output_lines = "ok", [], []
    launch_info = {
        "emulate_network": opts.emulate_network,
        "inter_node_bandwidth": opts.inter_node_bandwidth,
        "network": net.describe() if net is not None else None,
    }
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    with open(logs / "launcher.log", "w") as log_file:
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
                )
                procs.append(proc)
                pump = threading.Thread(
                    target=_pump, args=(proc.stdout, [log, log_file], output_lines), daemon=True
                )
                pump.start()
                pumps.append(pump)
            _wait_all(procs, opts.timeout)
        except subprocess.TimeoutExpired:
            stopped = [e for proc in procs for e in _kill_job(proc)]
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
            for proc in procs:
                _kill_job(proc)
            for pump in pumps:
                pump.join(timeout=2)
            how = (
                f"interrupted ({exc.args[0]})"
                if isinstance(exc, Terminated)
                else "interrupted (Ctrl-C)"
            )
            _finalise(
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
    rank_errors = _rank_errors(run, "".join(output_lines), opts.nproc // opts.nodes if net else 0)
    if status == "ok" and rc != 0:
        status = "failed"
        errors = rank_errors or [
            {"rank": None, "kind": "exit", "message": f"torchrun exited with status {rc}"}
        ]
    elif status == "timeout":
        errors += rank_errors
    wall = time.monotonic() - t0
    _finalise(
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
