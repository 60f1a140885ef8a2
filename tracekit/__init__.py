"""tracekit: make the cost of distributed-training strategies visible.

Data flows one way: capture -> run folder -> ingest -> events -> timeline -> analyses ->
figures -> app/report. ``tracekit.analyze(path)`` runs the middle of that chain in one call.
"""
from __future__ import annotations

__version__ = "0.1.0"

from tracekit.errors import TracekitError

__all__ = ["TracekitError", "__version__", "analyze"]


def analyze(path, **kwargs):  # noqa: ANN001, ANN201 - thin lazy re-export
    """Analyse a run folder, a folder of Kineto traces or one trace; see tracekit.analyze.analyze."""
    from tracekit.analyze import analyze as _analyze

    return _analyze(path, **kwargs)
