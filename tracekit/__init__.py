"""tracekit: make the cost of distributed-training strategies visible.

Data flows one way: capture -> run folder -> ingest -> events -> timeline -> analyses ->
figures -> app/report. ``tracekit.analyze(path)`` runs the middle of that chain in one call.
"""

from __future__ import annotations

import os

from tracekit._version import __version__

# polars' allocator (jemalloc) keeps freed pages for 10 s by default; an analysis builds and
# drops whole-job frames in turn, so peak RSS counted freed pages again. 300 ms gives them
# back almost at once for no measurable CPU (-10 % peak RSS at 1M events, benchmarks/README.md).
# It takes effect only if polars is not loaded yet; a setting of the user's own wins.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:300,muzzy_decay_ms:0")

# eager on purpose: importing the submodule tracekit.analyze would otherwise replace a lazy
# function of the same name on the package after its first call
from tracekit.analyze import Analysis, analyze
from tracekit.errors import TracekitError
from tracekit.predict import predict  # eager for the same reason as analyze

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

# the capture API imports torch: loaded on first use so that `tracekit analyze` starts fast
_PROFILER_NAMES = ("profile", "profiled", "StepProfiler", "Profiler", "ProfileWarning")


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 lazy attributes
    if name in _PROFILER_NAMES:
        from tracekit.capture import profiler

        return getattr(profiler, name)
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
