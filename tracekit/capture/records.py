"""The rest of a rank's run folder: losses, parameters, versions and environment, flight recorder.

records.write_train(run, rank, losses)         train/rank<R>.json
records.save_params(run, rank, state)          train/params_rank<R>.pt (tests)
records.dump_flight_recorder(run, rank)        nccl/fr_rank<R>.json
records.versions(), records.environment()      run.json ``versions`` and ``environment``
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from tracekit import runfolder
from tracekit.capture.memory import local_shard


def write_train(run: Path | str, rank: int, losses: list[float], **extra: Any) -> Path:
    """Write ``train/rank<R>.json``: this rank's local loss per step (plus e.g. step times)."""
    path = runfolder.train_path(Path(run), rank)
    runfolder.write_json_atomic(path, {"rank": rank, "losses": [float(x) for x in losses], **extra})
    return path


# --- parameters (tests compare them with the single-process reference) --------------------------


def params_path(run: Path | str, rank: int) -> Path:
    return runfolder.train_path(Path(run), rank).parent / f"params_rank{rank}.pt"


def save_params(run: Path | str, rank: int, state: dict[str, torch.Tensor]) -> Path:
    """``train/params_rank<R>.pt``: a CPU state dict (load with ``torch.load(weights_only=True)``)."""
    path = params_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    torch.save({k: local_shard(v).detach().cpu().clone() for k, v in state.items()}, tmp)
    os.replace(tmp, path)
    return path


def load_params(run: Path | str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(params_path(run, rank), weights_only=True, map_location="cpu")


# --- run.json helpers ----------------------------------------------------------------------------

ENV_PREFIXES = ("NCCL_", "OMP_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "MKL_")


def versions() -> dict[str, str]:
    """run.json ``versions``: python, torch, tracekit."""
    import tracekit

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tracekit": tracekit.__version__,
    }


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(threads_per_rank: int | None = None, gpu: str | None = None) -> dict[str, Any]:
    """run.json ``environment``: cpu model, threads per rank, NCCL_*/OMP_*/GLOO_*/... variables."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads_per_rank": torch.get_num_threads()
        if threads_per_rank is None
        else threads_per_rank,
        "platform": platform.platform(),
        "gpu": gpu,
        "variables": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


# --- flight recorder ----------------------------------------------------------------------------


def flight_recorder_path(run: Path | str, rank: int) -> Path:
    return runfolder.nccl_dir(Path(run)) / f"fr_rank{rank}.json"


def dump_flight_recorder(run: Path | str, rank: int) -> Path | None:
    """Write PyTorch's flight-recorder JSON to ``nccl/fr_rank<R>.json``; None (never an error) if unavailable."""
    try:
        dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
        if dump is None:
            return None
        raw = dump(includeCollectives=True, onlyActive=False)
        text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
        path = flight_recorder_path(run, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
        return path
    except Exception as exc:  # noqa: BLE001 - a diagnostic must never fail the run
        print(
            f"tracekit: flight recorder dump skipped on rank {rank}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return None
