"""How a job ended, in run.json: the ranks' errors (root cause first), logs moved, status written.

torchrun leaves each rank's stdout, stderr and error file under logs/torchrun/; they are moved to
``logs/rank<R>.*`` and the error files, with torchrun's failure summary for ranks killed by a
signal, become run.json ``errors``. If rank 0 never wrote run.json, the launcher writes what it
knows (:func:`fallback_run_json`); :func:`finalise` sets ``status``, ``errors`` and ``launch``.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracekit import runfolder
from tracekit.errors import TracekitError
from tracekit.strategies.options import RunOptions, backend_of, declared


def logs_dir(run: Path) -> Path:
    """``<run>/logs``: the launcher's log, each rank's output and error file."""
    return Path(run) / "logs"


_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n"
    r"\s*error_file:\s*(?P<file>[^\n]*)\n\s*traceback\s*:\s*(?P<tb>[^\n]*)"
)


_ROOT_CAUSE = re.compile(
    r"Root Cause[^\n]*\n\[\d+\]:\n(?:[^\n]*\n){0,3}?\s*rank\s*:\s*(?P<rank>\d+)"
)


def _collect_rank_logs(run: Path, per_node: int = 0) -> dict[int, dict[str, Any]]:
    """Move torchrun's per-rank files to logs/rank<R>.*; return the error files' contents by rank."""
    logs = logs_dir(run)
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


def rank_errors(run: Path, output: str, per_node: int = 0) -> list[dict[str, Any]]:
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


def agent_exit(code: int) -> str:
    """torchrun's exit status in words (a negative one: the signal that killed it)."""
    if code < 0 and -code in signal.Signals._value2member_map_:
        name = signal.Signals(-code).name
        return f"torchrun was killed by {name} (exit status {code}); its ranks were stopped"
    return f"torchrun exited with status {code}"


def fallback_run_json(opts: RunOptions, run: Path, quick: bool = False) -> dict[str, Any]:
    """run.json when rank 0 never wrote one: what the launcher knows. ``quick`` (interrupted):
    without importing torch (tracekit.capture.records), which takes seconds on a busy machine; the
    versions then come from the installed packages' metadata and the environment is unknown."""
    if quick and "tracekit.capture.records" not in sys.modules:
        import platform
        from importlib import metadata

        from tracekit._version import __version__

        try:
            torch_version: str | None = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
        versions: Mapping[str, str | None] = {
            "python": platform.python_version(),
            "torch": torch_version,
            "tracekit": __version__,
        }
        environment = None
    else:
        from tracekit.capture import records

        versions, environment = records.versions(), records.environment(threads_per_rank=1)
    per_node = opts.nproc // opts.nodes
    host = socket.gethostname()
    config = {  # the launcher's options, as it was given them
        f.name: (str(v) if isinstance(v, Path) else v)
        for f, _, _ in declared("run")
        for v in [getattr(opts, f.name)]
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


def finalise(
    opts: RunOptions, run: Path, status: str, errors: list[dict[str, Any]], launch: dict[str, Any]
) -> None:
    # a rank killed while exporting leaves its temporary file. Ours by construction, not by
    # name: RUN was made by this launch (runfolder.new_run_dir: an exclusive mkdir), so all
    # that is in its traces/ and nccl/ was written by this job's ranks
    for folder in (runfolder.traces_dir(run), runfolder.nccl_dir(run)):
        for tmp in folder.glob(".*.tmp*"):
            tmp.unlink(missing_ok=True)
    try:
        data = runfolder.load_run_json(run)
    except TracekitError:
        data = None
    if data is None:
        data = fallback_run_json(opts, run, quick=status == "interrupted")
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
