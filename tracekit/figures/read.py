"""What figures and report tables read from an analysis: its frames, and the summary's sections
with their fallbacks, in one place.

The summary is summary.json as a nested dict: a section is null when the run has no such data
and a list of rows may be null too. Every ``x.get(k) or {}`` / ``or []`` of the figures and the
report goes through :func:`section`, :func:`section_rows`, :func:`rank_rows` and :func:`warnings`, so that reading typed
attributes instead (tracekit.summary) changes these few functions and their call sites only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import polars as pl


def frame(analysis: Any, name: str) -> pl.DataFrame | None:
    """A frame of an Analysis by name (attribute, or an entry of ``tables()``), or None."""
    value = getattr(analysis, name, None)
    if isinstance(value, pl.DataFrame):
        return value
    for attr in ("frames", "extra_frames"):
        d = getattr(analysis, attr, None)
        if isinstance(d, dict) and isinstance(d.get(name), pl.DataFrame):
            return d[name]
    tables = getattr(analysis, "tables", None)
    if callable(tables):
        try:
            value = tables().get(name)
        except Exception:  # a half-built analysis: no such frame
            value = None
        if isinstance(value, pl.DataFrame):
            return value
    return None


def section(summary: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """``summary[name]``: a section (or any nested object) of the summary; {} when null."""
    return (summary or {}).get(name) or {}


def section_rows(summary: Mapping[str, Any] | None, name: str, key: str) -> list[dict[str, Any]]:
    """``summary[name][key]``: a section's list of rows; [] when the section or the list is null."""
    return section(summary, name).get(key) or []


def rank_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-rank rows of the summary (``ranks``); [] when null."""
    return summary.get("ranks") or []


def op_label(row: Mapping[str, Any]) -> str:
    """A row's collective op, "unknown" when the trace did not name it."""
    return row.get("op") or "unknown"


def num(x: Any) -> float:
    """A value to draw: a number, with null / NaN / non-numbers as 0 (tables show them "–")."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def warnings(summary: Mapping[str, Any]) -> list[str]:
    """The analysis' warnings (``warnings``); [] when null."""
    return summary.get("warnings") or []
