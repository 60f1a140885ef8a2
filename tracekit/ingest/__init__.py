"""Ingest: trace files in, the events table (tracekit.events) out.

``read_trace`` reads one Kineto trace, ``read_traces`` several ranks in parallel; see
tracekit.ingest.kineto for the column rules.
"""

from __future__ import annotations

from tracekit.ingest.kineto import TraceInfo, read_trace, read_traces

__all__ = ["TraceInfo", "read_trace", "read_traces"]
