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
import stat
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


def contention_path(run: Path, rank: int) -> Path:
    """contention/rank<R>.json: how long the rank waited for a CPU (tracekit.capture.contention)."""
    return Path(run) / "contention" / f"rank{rank}.json"


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


def not_regular(path: Path) -> str | None:
    """What PATH is, in words, when it is not a regular file once symlinks are followed ("a
    FIFO", "a symbolic link to a character device (/dev/zero)"); None for a regular file."""
    from tracekit.guarded_read import kind_of

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a symbolic link to nothing" if os.path.islink(path) else None
    if stat.S_ISREG(mode):
        return None
    kind = kind_of(mode)
    return f"a symbolic link to {kind} ({os.path.realpath(path)})" if os.path.islink(path) else kind


def _skip(p: Path, skipped: list[str] | None) -> None:
    """Note P, named like an input but not a regular file, for a warning: never skipped silently."""
    what = not_regular(p)
    if skipped is not None and what is not None and not p.name.startswith("."):
        skipped.append(f"{p}: is {what}, not a regular file: not read")


def find_trace_files(path: Path, skipped: list[str] | None = None) -> list[Path]:
    """The trace files PATH names: one file, a run folder's traces/, or a folder searched recursively.

    Our own outputs (analysis/, memory/, train/, nccl/, run.json) are never taken for traces; a
    run folder met in the search is read as when named itself: its traces/ only (not its
    contention/, straggler or other side files).
    Entries named like a trace that are not regular files (FIFOs, devices, sockets, folders,
    links to them) are not read; each is added to SKIPPED as a warning line.
    """
    path = Path(path)
    if not is_folder(path):
        return [path]
    _check_readable_dir(path)
    if is_run_folder(path):
        root = traces_dir(path)
        if not root.is_dir():
            return []
        _check_readable_dir(root)
        named = sorted(p for p in root.glob("*") if p.name.endswith(TRACE_SUFFIXES))
        for p in named:
            _skip(p, skipped)
        return [p for p in named if is_trace_file(p)]
    skip = {"analysis", "memory", "train", "nccl", "logs"}

    def unreadable(exc: OSError) -> None:  # never skip a folder silently
        raise TracekitError(f"cannot read the folder ({exc.strerror or exc})", exc.filename)

    files = []
    for folder, subdirs, names in os.walk(path, onerror=unreadable):
        rel = Path(folder).relative_to(path).parts
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        if any(part in skip or part.endswith(".analysis") for part in rel):
            subdirs[:] = []
            continue
        here = Path(folder)
        if rel and is_run_folder(here):  # a run inside: its traces/ alone, as find_trace_files(it)
            subdirs[:] = ["traces"] if "traces" in subdirs else []
            continue
        if len(rel) > 1 and rel[-1] == "traces" and is_run_folder(here.parent):
            subdirs[:] = []  # a run's traces/ is read flat, as traces_dir's glob reads it
        for name in sorted(names):
            p = Path(folder) / name
            if name in ("run.json", "summary.json") or not name.endswith(TRACE_SUFFIXES):
                continue
            if is_trace_file(p):
                files.append(p)
            else:
                _skip(p, skipped)
    return sorted(files)


def is_folder(path: Path) -> bool:
    """True for a folder, False for a file; TracekitError when it is neither or cannot be looked at."""
    try:
        st = Path(path).stat()
    except FileNotFoundError:
        raise TracekitError("no such file or folder", path) from None
    except OSError as exc:  # e.g. a parent folder without permission
        raise TracekitError(f"cannot look at it ({exc.strerror or exc})", path) from None
    if stat.S_ISDIR(st.st_mode):
        return True
    if stat.S_ISREG(st.st_mode):
        return False
    raise TracekitError("neither a file nor a folder", path)


def _check_readable_dir(folder: Path) -> None:
    if not os.access(folder, os.R_OK | os.X_OK):
        raise TracekitError("cannot read the folder (Permission denied)", folder)


def load_run_json(run: Path) -> dict[str, Any] | None:
    """run.json of a run folder, or None when PATH is not one; a damaged run.json is an error."""
    from tracekit import guarded_read

    p = run_json_path(run)
    if not os.path.lexists(p):
        return None
    try:
        raw = guarded_read.read_limited(p)  # a FIFO, a link to /dev/zero: one line, no hang
    except TracekitError as exc:
        raise TracekitError(f"cannot read run.json: {exc.problem}", p) from None
    try:
        data = guarded_read.decode_json(raw, p)
    except TracekitError as exc:
        raise TracekitError(f"run.json is damaged ({exc.problem})", p) from None
    if not isinstance(data, dict):
        raise TracekitError("run.json is not a JSON object", p)
    problem = _run_json_problem(data)
    if problem:
        raise TracekitError(f"run.json is damaged ({problem})", p)
    return data


RANK_LIMIT = 2**31  # ranks are 0 .. 2^31-1: torch's int32, and the Int32 rank column


def _is_int(value: Any, low: int = 0) -> bool:
    return type(value) is int and value >= low


def _run_json_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with the keys analysis relies on, or None (absent keys are fine)."""
    world = data.get("world_size")
    if world is not None and not _is_int(world, 1):
        return f"world_size {str(world)[:40]!r} is not a positive integer"
    if world is not None and world > RANK_LIMIT:  # ranks are 32-bit everywhere (torch, frames)
        return f"world_size {world} is more than {RANK_LIMIT} ranks"
    for key in ("status", "strategy", "backend", "device", "precision"):  # summary.json echoes them
        if not isinstance(data.get(key), (str, type(None))):
            return f"{key} is not text"
    if not isinstance(data.get("errors", []), (list, type(None))):
        return "errors is not a list"
    if not isinstance(data.get("config", {}), (dict, type(None))):
        return "config is not an object"
    topo = data.get("topology")
    if topo is None:
        return None
    if not isinstance(topo, list):
        return "topology is not a list"
    for row in topo:
        if (
            not isinstance(row, dict)
            or not _is_int(row.get("rank"))
            or row["rank"] >= RANK_LIMIT
            or not _is_int(row.get("node", 0))
        ):
            return f"topology entry {str(row)[:60]!r} lacks an integer rank and node"
    return None


def flight_recorder_dumps(path: Path) -> list[Path]:
    """Flight-recorder JSON dumps of a run folder (nccl/) or a foreign folder (fr_rank*.json,
    nccl_trace_rank*.json); for a trace file, those beside it. Listed, not read."""
    path = Path(path)
    if not path.is_dir():
        path = path.parent
    found = []
    nccl = nccl_dir(path)
    if nccl.is_dir():
        found += sorted(p for p in nccl.glob("*.json") if not p.name.startswith("."))
    found += sorted(p for pat in ("fr_rank*.json", "nccl_trace_rank*.json") for p in path.glob(pat))
    return list(dict.fromkeys(found))


def skipped_nccl_entries(path: Path) -> list[str]:
    """Warnings for the entries of folder PATH's nccl/ named like a log (``*.log``, ``*.log.gz``,
    ``*.txt``) that are not regular files: they are not read (dumps, ``*.json``, are refused
    with a warning by the flight-recorder reader)."""
    folder = nccl_dir(Path(path))
    try:
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []
    skipped: list[str] = []
    for p in entries:
        if p.name.endswith((".log", ".log.gz", ".txt")):
            _skip(p, skipped)
    return skipped


def nccl_log_dir(path: Path) -> Path | None:
    """PATH/nccl/ when PATH is a folder whose nccl/ holds NCCL_DEBUG logs (*.log, *.log.gz,
    *.txt), else None."""
    folder = nccl_dir(Path(path)) if Path(path).is_dir() else None
    if folder is None or not folder.is_dir():
        return None
    if not any(p.name.endswith((".log", ".log.gz", ".txt")) for p in folder.iterdir()):
        return None
    return folder


def memory_ranks(path: Path) -> set[int]:
    """Ranks R with a memory/rank<R>.json in folder PATH: the folder is listed, so a declared
    world size of 10^9 costs nothing (it is never looped over); empty when unreadable."""
    try:
        names = [p.name for p in memory_path(Path(path), 0).parent.iterdir()]
    except OSError:
        return set()
    found = (re.fullmatch(r"rank(\d{1,10})\.json", n) for n in names)
    return {int(m.group(1)) for m in found if m}


def load_side_json(path: Path) -> tuple[Any | None, str | None]:
    """A small JSON side file (memory/, contention/): (its value, None), (None, None) when it is
    absent, or (None, a warning naming it) when it cannot be read (tracekit.guarded_read:
    a FIFO, a link to a device, too large, too deep, not JSON): the analysis goes without it."""
    from tracekit import guarded_read

    if not os.path.lexists(path):
        return None, None
    try:
        return guarded_read.load_json(path, finite=False), None  # each figure is checked
    except TracekitError as exc:
        return None, f"{exc}; ignored"


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


def check_runs_parent(parent: Path, option: str = "--out") -> None:
    """Refuse (one line) a parent of run folders that is, or lies under, something other than
    a folder (an existing file: `tracekit run --out notes.txt`); checked before any rank starts."""
    here = Path(parent)
    while True:
        try:
            st = here.stat()
        except (FileNotFoundError, NotADirectoryError):  # not there yet, or under a file
            if here.parent == here:
                return
            here = here.parent
            continue
        except OSError as exc:
            raise TracekitError(f"cannot look at it ({exc.strerror or exc})", here) from None
        if not stat.S_ISDIR(st.st_mode):
            what = "is" if here == Path(parent) else f"lies under {here}, which is"
            raise TracekitError(
                f"{what} not a folder: run folders go into a folder; choose another place "
                f"with {option}",
                parent,
            )
        return


def new_run_dir(parent: Path, strategy: str, stamp: str) -> Path:
    """Create ``parent/<strategy>-<stamp>`` (suffix -2, -3 if taken) and return it."""
    parent = Path(parent)
    check_runs_parent(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TracekitError(f"cannot make the folder ({exc.strerror or exc})", parent) from None
    base = f"{strategy}-{stamp}"
    for i in range(1, 10_000):
        candidate = parent / (base if i == 1 else f"{base}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise TracekitError("could not create a run folder", parent)


def analysis_out_dir(path: Path) -> Path:
    """Where PATH's analysis goes by default: PATH/analysis for folders, FILE.analysis/ for a
    single trace file (tracekit.analysis_folder.default_out_dir)."""
    path = Path(path)
    return analysis_dir(path) if is_folder(path) else path.with_name(path.name + ".analysis")
