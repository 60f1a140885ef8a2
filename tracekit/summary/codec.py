"""summary.json <-> Summary: ``to_struct`` checks analyze()'s dict once, ``encode`` writes the
exact text ``json.dumps(summary, indent=2, default=str) + "\\n"`` gives, ``from_json`` reads it.

Conversion is strict: an unknown key, a missing one or a wrong type is a msgspec.ValidationError
naming its path, so the schema cannot drift from what analyze() writes. An int where a float is
declared becomes a float (msgspec's one coercion); every float field is a float in analyze().
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from tracekit.summary.schema import Summary

# collectives_summary writes an input without collective calls (count 0) with these keys only,
# in this order; the Struct holds the full shape (zero sizes, no byte texts), and encode writes
# it back as it was. Delete with the short form once collectives_summary writes every key.
_EMPTY_ORDER = (
    "count",
    "bytes",
    "ideal_bytes_per_rank",
    "per_op",
    "per_group",
    "time_basis",
    "calls",
    "complete_calls",
    "ideal_bytes_per_rank_per_step",
)
_EMPTY_FILL = {"rank_bytes": 0, "call_bytes": 0, "unknown_size": 0, "bytes_counted": {}}


def to_struct(summary: dict[str, Any]) -> Summary:
    """analyze()'s summary dict as a Summary; msgspec.ValidationError when it does not fit."""
    coll = summary.get("collectives") if isinstance(summary, dict) else None
    if isinstance(coll, dict) and coll.get("count") == 0 and "rank_bytes" not in coll:
        if set(coll) != set(_EMPTY_ORDER):
            raise msgspec.ValidationError(
                f"collectives without calls holds {sorted(coll)}, not {sorted(_EMPTY_ORDER)}"
            )
        summary = {**summary, "collectives": {**coll, **_EMPTY_FILL}}
    return msgspec.convert(summary, Summary, strict=True)


def to_builtins(summary: Summary) -> dict[str, Any]:
    """The summary as dicts and lists, keys in analyze()'s order."""
    out = msgspec.to_builtins(summary)
    coll = out["collectives"]
    if coll["count"] == 0:
        out["collectives"] = {k: coll[k] for k in _EMPTY_ORDER}
    return out


def encode(summary: Summary) -> str:
    """summary.json's text, byte for byte what write_analysis wrote from the dict."""
    return json.dumps(to_builtins(summary), indent=2, default=str) + "\n"


def from_json(data: bytes | str) -> Summary:
    """A summary.json's text as a Summary (NaN and Infinity read as json.dumps wrote them)."""
    return to_struct(json.loads(data))
