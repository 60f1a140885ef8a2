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


def to_struct(summary: dict[str, Any]) -> Summary:
    """analyze()'s summary dict as a Summary; msgspec.ValidationError when it does not fit."""
    return msgspec.convert(summary, Summary, strict=True)


def to_builtins(summary: Summary) -> dict[str, Any]:
    """The summary as dicts and lists, keys in analyze()'s order."""
    return msgspec.to_builtins(summary)


def encode(summary: Summary) -> str:
    """summary.json's text, byte for byte what write_analysis wrote from the dict."""
    return json.dumps(to_builtins(summary), indent=2, default=str) + "\n"


def from_json(data: bytes | str) -> Summary:
    """A summary.json's text as a Summary (NaN and Infinity read as json.dumps wrote them)."""
    return to_struct(json.loads(data))
