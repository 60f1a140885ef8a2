"""summary.json as typed msgspec Structs: the one place each metric is defined.

Each field carries its definition (``M(...)`` in tracekit/summary/base.py), docs/metrics.md's
per-field tables are generated from them (``python -m tracekit.summary --markdown``), and
summary.json is ``encode(to_struct(analysis.summary))``; readers use ``from_json``.
"""

from tracekit.summary.codec import encode, from_json, to_builtins, to_struct
from tracekit.summary.schema import Summary

__all__ = ["Summary", "encode", "from_json", "to_builtins", "to_struct"]
