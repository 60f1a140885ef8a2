"""The frames figures and reports read from an analysis, by name.

The summary is read as attributes of its typed form (``analysis.summary``,
tracekit.summary); frames stay polars frames and are found here: an attribute of the
Analysis (``timeline``, ``events``, ...) or one of the sections' frames (``bubbles``, ...).
"""

from __future__ import annotations

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
