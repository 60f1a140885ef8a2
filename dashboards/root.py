"""What the app may show and where it listens: the runs under ROOT, ``?run=`` resolution, the bind.

The rule:

- **Bind**: ``tracekit dash`` listens on 127.0.0.1 (``DEFAULT_HOST``). Any other host is served
  only when asked for, with ``host_warning`` on stderr: the app has no authentication.
- **Listing**: run folders (a ``run.json``) and trace folders under ROOT, at most ``MAX_DEPTH``
  folders down and ``MAX_LISTED`` of them; hidden folders, our own outputs (``SKIP_DIRS``,
  ``*.analysis``) and symlinks are never entered, and a symlinked run is never listed.
- **?run=**: resolved against ROOT and refused with ``Refused`` (a plain message that shows
  nothing of the target) when it is not a string of 1 to 1000 characters without NUL, is
  absolute (posix, Windows, a drive, ``~``), has a ``..`` part, does not exist, leads out of
  ROOT through a symlink (itself, or any of the first ``MAX_WALK`` entries inside the run), or
  is neither a run folder, a trace folder nor a trace file.
- **Nothing else**: the app reads runs only through tracekit.analyze of a resolved path and
  serves no file of ROOT (Dash's own assets and plotly.js aside, dashboards.plotly_js).
"""

from __future__ import annotations

import os
from collections.abc import Container
from pathlib import Path, PurePosixPath, PureWindowsPath

from tracekit import runfolder

DEFAULT_HOST = "127.0.0.1"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
MAX_LISTED = 500
MAX_DEPTH = 4
MAX_WALK = 20_000
SKIP_DIRS = {"analysis", "memory", "train", "nccl", "__pycache__", "node_modules"}


class Refused(Exception):
    """A ?run= that is not a run under ROOT; str() is the plain message shown."""


def host_warning(host: str) -> str | None:
    """The stderr warning for a host other than this machine's loopback, else None."""
    if host in LOCAL_HOSTS:
        return None
    return (
        f"tracekit dash: warning: serving on {host}, reachable from other machines; the app has "
        "no authentication and shows every run under the root folder"
    )


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _has_traces(folder: Path, names: list[str]) -> bool:
    return any(
        runfolder.is_trace_file(folder / n) and n not in ("run.json", "summary.json") for n in names
    )


def find_runs(root: Path) -> list[str]:
    """Run folders and trace folders under the resolved ROOT (relative, posix, sorted)."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel = here.relative_to(root)
        if runfolder.is_run_folder(here) or _has_traces(here, filenames):
            if not here.is_symlink():
                found.append(rel.as_posix())
            dirnames[:] = []
        else:
            depth = len(rel.parts)
            dirnames[:] = sorted(
                d
                for d in dirnames
                if depth < MAX_DEPTH
                and d not in SKIP_DIRS
                and not d.startswith(".")
                and not d.endswith(".analysis")
                and not (here / d).is_symlink()
            )
        if len(found) >= MAX_LISTED:
            break
    return sorted(found)


def resolve(root: Path, rel: str, names: Container[str] = ()) -> Path | str:
    """``?run=REL`` as a resolved path under the resolved ROOT, or REL itself when it is one of
    NAMES (analyses given in memory); Refused when it is not a run under ROOT (the rule above)."""
    refusal = Refused(
        f"refused: {rel!r} is not a run folder or trace folder inside this dashboard's root"
    )
    if not isinstance(rel, str) or not rel or len(rel) > 1000 or "\x00" in rel:
        raise refusal
    if rel in names:
        return rel
    if (
        rel.startswith(("/", "\\", "~"))
        or PurePosixPath(rel).is_absolute()
        or PureWindowsPath(rel).is_absolute()
        or PureWindowsPath(rel).drive
    ):
        raise refusal
    if any(part == ".." for part in rel.replace("\\", "/").split("/")):
        raise refusal
    try:
        path = (root / rel).resolve(strict=True)
    except (OSError, RuntimeError):
        raise refusal from None
    if not _inside(path, root):
        raise refusal
    if path.is_dir():
        if not (runfolder.is_run_folder(path) or runfolder.find_trace_files(path)):
            raise refusal
        seen = 0
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                seen += 1
                if seen > MAX_WALK:
                    raise refusal
                if p.is_symlink():
                    try:
                        target = p.resolve(strict=False)
                    except (OSError, RuntimeError):
                        raise refusal from None
                    if not _inside(target, root):
                        raise refusal
    elif not runfolder.is_trace_file(path):
        raise refusal
    return path
