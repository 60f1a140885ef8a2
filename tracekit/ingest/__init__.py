"""Ingest: trace files in, the events table (tracekit.events) out.

``read_trace`` reads one Kineto trace, ``read_traces`` several ranks in parallel
(tracekit.ingest.kineto; the column rules: tracekit.ingest.kineto_classify).

The names are loaded on first use (PEP 562): the modules that read a file without polars
(kineto_files, the C scanner ``_kscan``) can be imported while polars is still loading.
"""

from __future__ import annotations

from tracekit._lazy import lazy_attributes

__all__ = ["TraceInfo", "read_trace", "read_traces"]

_LAZY = {
    "read_trace": "tracekit.ingest.kineto",
    "read_traces": "tracekit.ingest.kineto",
    "TraceInfo": "tracekit.ingest.kineto_info",
}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
