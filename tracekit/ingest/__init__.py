"""Ingest: trace files in, the events table (tracekit.events) out.

``read_trace`` reads one Kineto trace, ``read_traces`` several ranks in parallel
(tracekit.ingest.kineto; the column rules: tracekit.ingest.kineto_classify).
"""

from __future__ import annotations

from tracekit.ingest.kineto import read_trace, read_traces
from tracekit.ingest.kineto_info import TraceInfo

__all__ = ["TraceInfo", "read_trace", "read_traces"]
