"""Ingest: trace files in, the events table (tracekit.events) out.

``read_trace`` reads one Kineto trace, ``read_traces`` several ranks in parallel
(tracekit.ingest.kineto; the column rules: tracekit.ingest.kineto_classify).

The names are loaded on first use (PEP 562): the modules that read a file without polars
(kineto_files, the C scanner ``_kscan``) can be imported while polars is still loading.
"""

from __future__ import annotations

import importlib

__all__ = ["TraceInfo", "read_trace", "read_traces"]

_LAZY = {
    "read_trace": "tracekit.ingest.kineto",
    "read_traces": "tracekit.ingest.kineto",
    "TraceInfo": "tracekit.ingest.kineto_info",
}


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 lazy attributes
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tracekit.ingest' has no attribute {name!r}")
