"""The name a run is shown by: its strategy plus the options that set it apart.

    display_name(run_json)         "zero3 (prefetch 0)", "pp-gpipe (8 microbatches)", "dp"
    display_names(paths)           one distinct name per path, for a table of several runs

One function for every place that lists runs side by side (``tracekit compare``, ``tracekit
demo``, the Dash index), so that a run reads the same everywhere. The name comes from run.json
``strategy`` and ``config``, each option shown as its declaration says (``phrase`` in
tracekit.strategies.options); a folder of traces without a run.json is shown by its folder name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracekit import runfolder
from tracekit.errors import TracekitError
from tracekit.strategies.options import name_phrases

# asked only when two runs would share a name: options that every run has (value -> phrase)
_TIEBREAK = (
    ("nproc", lambda v: f"{v} ranks"),
    ("device", str),
    ("backend", str),
    ("steps", lambda v: f"{v} steps"),
)


def _config(run: object) -> Mapping[str, Any]:
    """run.json's ``config``; {} when there is none."""
    config = run.get("config") if isinstance(run, Mapping) else None
    return config if isinstance(config, Mapping) else {}


def display_name(run: Mapping[str, Any] | None, fallback: str = "?") -> str:
    """``strategy (option, option)`` from a run.json dict; ``fallback`` when there is none."""
    if not isinstance(run, Mapping) or not run.get("strategy"):
        return fallback
    opts = name_phrases(_config(run))
    return f"{run['strategy']} ({', '.join(opts)})" if opts else str(run["strategy"])


def load_run(path: Path) -> dict[str, Any] | None:
    """run.json of a run folder, None for anything else (a trace folder, a file, a bad run.json)."""
    path = Path(path)
    if not path.is_dir():
        return None
    try:
        return runfolder.load_run_json(path)
    except TracekitError:
        return None


def _folder_name(path: Path) -> str:
    return path.name or Path(os.path.abspath(path)).name or str(path)


def names_for(runs: Sequence[tuple[Path, Mapping[str, Any] | None]]) -> list[str]:
    """Distinct display names for (path, run.json or None) pairs, in order.

    Runs that would share a name get the options that differ between them ("dp (4 ranks)"),
    then, if still the same, their folder name ("dp [dp-20261201-203929]"), then "#2", "#3"."""
    paths = [Path(p) for p, _ in runs]
    names = [display_name(r, _folder_name(p)) for p, r in zip(paths, (r for _, r in runs))]
    configs = [_config(r) for _, r in runs]
    for name in set(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) < 2:
            continue
        extra: dict[int, list[str]] = {i: [] for i in group}
        for key, phrase in _TIEBREAK:
            values = [configs[i].get(key) for i in group]
            if len({repr(v) for v in values}) > 1:
                for i, v in zip(group, values):
                    if v is not None:  # a run.json without it keeps the shorter name
                        extra[i].append(phrase(v))
        for i in group:
            if extra[i]:
                base = names[i]
                names[i] = (
                    f"{base[:-1]}, {', '.join(extra[i])})"
                    if base.endswith(")")
                    else f"{base} ({', '.join(extra[i])})"
                )
    for name in set(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) > 1:
            for i in group:
                if _folder_name(paths[i]) != name:
                    names[i] = f"{name} [{_folder_name(paths[i])}]"
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def display_names(paths: Sequence[Path]) -> list[str]:
    """Distinct display names of these runs (run folders, trace folders or files), in order."""
    return names_for([(Path(p), load_run(Path(p))) for p in paths])
