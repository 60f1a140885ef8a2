"""``python -m tracekit``: the same program as the ``tracekit`` console script."""

from tracekit.cli import run

run()
