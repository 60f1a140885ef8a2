"""tracekit: make the cost of distributed-training strategies visible.

Data flows one way: capture -> run folder -> ingest -> events -> timeline -> analyses ->
figures -> app/report. ``tracekit.analyze(path)`` runs the middle of that chain in one call.

The public names are loaded on first use (PEP 562): ``import tracekit`` costs milliseconds, so
`tracekit analyze` can start reading its traces (tracekit.ingest.read_ahead) while
polars and the analyses are imported. The capture API (``profile``, ...) imports torch.
"""

from __future__ import annotations

import os

from tracekit._lazy import lazy_attributes
from tracekit._version import __version__
from tracekit.errors import TracekitError

# polars' allocator (jemalloc) keeps freed pages for 10 s by default; an analysis builds and
# drops whole-job frames in turn, so peak RSS counted freed pages again. 300 ms gives them
# back almost at once for no measurable CPU (-10 % peak RSS at 1M events, benchmarks/README.md).
# It takes effect only if polars is not loaded yet; a setting of the user's own wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:300,muzzy_decay_ms:0")

__all__ = [
    "Analysis",
    "StepProfiler",
    "TracekitError",
    "__version__",
    "analyze",
    "predict",
    "profile",
    "profiled",
]

#: public name -> the module that defines it
_LAZY = {
    "Analysis": "tracekit.analysis",
    "analyze": "tracekit.analysis",
    "predict": "tracekit.analysis",
    **{
        name: "tracekit.capture.profiler"
        for name in ("profile", "profiled", "StepProfiler", "Profiler", "ProfileWarning")
    },
}
__getattr__ = lazy_attributes(__name__, _LAZY, globals())
