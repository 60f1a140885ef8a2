"""The run folder: the only module that knows where things live on disk.

```
<run>/run.json                schema_version, strategy, config, world_size, backend, device, ...
<run>/traces/rank<R>.json.gz  Kineto trace of rank R (R not zero-padded)
<run>/nccl/                   NCCL_DEBUG logs and flight-recorder JSON dumps
<run>/memory/rank<R>.json     the rank's model-state bytes counted from its tensors
<run>/train/rank<R>.json      losses per step (and, when asked, parameter checksums)
<run>/analysis/               summary.json + parquet tables, written by `tracekit analyze`
```

Trace files found in a foreign folder take their rank from ``distributedInfo.rank`` (ingest reads
it), else from ``rank<N>``, ``rank-<N>`` or ``rank_<N>`` in the file name; never from other digits.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError

RUN_SCHEMA_VERSION = 1
SUMMARY_SCHEMA_VERSION = 1

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"(?<![A-Za-z0-9])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)


def run_json_path(run: Path) -> Path:
    return Path(run) / "run.json"


def traces_dir(run: Path) -> Path:
    return Path(run) / "traces"


def trace_path(run: Path, rank: int) -> Path:
    return traces_dir(run) / f"rank{rank}.json.gz"


def memory_path(run: Path, rank: int) -> Path:
    return Path(run) / "memory" / f"rank{rank}.json"


def train_path(run: Path, rank: int) -> Path:
    return Path(run) / "train" / f"rank{rank}.json"


def nccl_dir(run: Path) -> Path:
    return Path(run) / "nccl"


def analysis_dir(run: Path) -> Path:
    return Path(run) / "analysis"


def is_run_folder(path: Path) -> bool:
    return Path(path).is_dir() and run_json_path(path).is_file()


def rank_from_filename(name: str) -> int | None:
    """The rank in ``rank<N>``, ``rank-<N>`` or ``rank_<N>`` of a file name, else None."""
    found = _RANK_IN_NAME.findall(Path(name).name)
    return int(found[-1]) if len(set(found)) == 1 else None


def is_trace_file(path: Path) -> bool:
    name = Path(path).name
    return path.is_file() and name.endswith(TRACE_SUFFIXES) and not name.startswith(".")


def find_trace_files(path: Path) -> list[Path]:
    """The trace files PATH names: one file, a run folder's traces/, or a folder searched recursively.

    Our own outputs (analysis/, memory/, train/, nccl/, run.json) are never taken for traces.
    """
    path = Path(path)
    if not path.exists():
        raise TracekitError("no such file or folder", path)
    if path.is_file():
        return [path]
    if is_run_folder(path):
        root = traces_dir(path)
        files = sorted(p for p in root.glob("*") if is_trace_file(p)) if root.is_dir() else []
        return files
    skip = {"analysis", "memory", "train", "nccl", "logs"}
    files = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).parts
        if any(part in skip or part.endswith(".analysis") for part in rel[:-1]):
            continue
        if is_trace_file(p) and p.name != "run.json" and p.name != "summary.json":
            files.append(p)
    return files


def load_run_json(run: Path) -> dict[str, Any] | None:
    """run.json of a run folder, or None when PATH is not one; a damaged run.json is an error."""
    p = run_json_path(run)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise TracekitError(f"run.json is damaged ({type(exc).__name__}: {exc})", p) from None
    if not isinstance(data, dict):
        raise TracekitError("run.json is not a JSON object", p)
    return data


def load_json_if_present(path: Path) -> Any | None:
    """A small JSON side file (memory/, train/) or None when absent or unreadable."""
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary name beside PATH, then rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run folders are shared with colleagues
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def new_run_dir(parent: Path, strategy: str, stamp: str) -> Path:
    """Create ``parent/<strategy>-<stamp>`` (suffix -2, -3 if taken) and return it."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    base = f"{strategy}-{stamp}"
    for i in range(1, 10_000):
        candidate = parent / (base if i == 1 else f"{base}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise TracekitError("could not create a run folder", parent)
