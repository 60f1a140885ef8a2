"""A whole summary from the few keys a test cares about, valid against tracekit.summary.

Hand-built analyses (figures, report and app tests) give the numbers they draw; every other
field of summary.json is filled in as null where the schema allows it, else 0, 0.0, "", False,
[] or {} (a nested object: completed the same way), so ``Analysis.summary`` accepts it.
A key the schema does not have is an error, as in summary.json.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import msgspec

from tracekit.summary import Summary

_EMPTY: dict[Any, Any] = {int: 0, float: 0.0, str: "", bool: False}


def _args(t: Any) -> tuple[Any, ...]:
    """The members of a union (``int | None``), else ``(t,)``."""
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return typing.get_args(t)
    return (t,)


def _struct_of(t: Any) -> type[msgspec.Struct] | None:
    return next(
        (a for a in _args(t) if isinstance(a, type) and issubclass(a, msgspec.Struct)), None
    )


def _empty(t: Any) -> Any:
    members = _args(t)
    if type(None) in members:
        return None
    (t,) = members
    if typing.get_origin(t) in (list, dict):
        return typing.get_origin(t)()
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return complete({}, t)
    return _EMPTY[t]


def _fill(t: Any, value: Any) -> Any:
    """``value`` with every object in it completed to its Struct."""
    if isinstance(value, dict) and (cls := _struct_of(t)) is not None:
        return complete(value, cls)
    lists = [a for a in _args(t) if typing.get_origin(a) is list]
    if isinstance(value, list) and lists:
        (item,) = typing.get_args(lists[0])
        return [_fill(item, v) for v in value]
    return value


def complete(given: dict[str, Any], cls: type[msgspec.Struct] = Summary) -> dict[str, Any]:
    """``given`` with every field of ``cls`` it lacks, in the schema's order."""
    unknown = set(given) - set(cls.__struct_fields__)
    if unknown:
        raise KeyError(f"{cls.__name__} has no field {sorted(unknown)}")
    hints = typing.get_type_hints(cls)
    return {
        name: _fill(hints[name], given[name]) if name in given else _empty(hints[name])
        for name in cls.__struct_fields__
    }
