"""docs/metrics.md's per-field tables, written from the Structs' field descriptions.

The document is hand-written prose with generated blocks: a block

    <!-- generated from tracekit/summary: Rank -->
    ...
    <!-- end generated -->

holds one table per named Struct (key, type, definition), and ``render(text)`` rewrites every
block from tracekit.summary. Every Struct of the summary must be in exactly one block, so a new
section cannot go undocumented.
"""

from __future__ import annotations

import re
import types
from typing import Any, Union, get_args, get_origin

import msgspec

from tracekit.summary.base import field_docs
from tracekit.summary.schema import Summary

BLOCK = re.compile(
    r"(<!-- generated from tracekit/summary: (?P<names>[\w ]+) -->\n)(?P<body>.*?)(<!-- end generated -->)",
    re.S,
)


def struct_paths(root: type[msgspec.Struct] = Summary) -> dict[type[msgspec.Struct], str]:
    """Every Struct reachable from ``root`` -> where it sits in summary.json (``ranks[]``)."""
    found: dict[type[msgspec.Struct], str] = {root: "summary.json"}

    def visit(cls: type[msgspec.Struct], path: str) -> None:
        for name, tp, _ in field_docs(cls):
            for inner, suffix in _structs_in(tp):
                where = f"{path}.{name}{suffix}".lstrip(".")
                if inner not in found:
                    found[inner] = where
                    visit(inner, where)

    visit(root, "")
    return found


def _structs_in(tp: Any, suffix: str = "") -> list[tuple[type[msgspec.Struct], str]]:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return [(tp, suffix)]
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return _structs_in(args[0], suffix + "[]")
    if origin is dict:
        return _structs_in(args[1], suffix + ".<key>")
    return [found for a in args for found in _structs_in(a, suffix)]


def type_text(tp: Any) -> str:
    """A field's JSON type in words: int, float, string, bool, [int], {string: int}, Rank, or null."""
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp.__name__
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return f"[{type_text(args[0])}]"
    if origin is dict:
        return f"{{{type_text(args[0])}: {type_text(args[1])}}}"
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    return {int: "int", float: "float", str: "string", bool: "bool"}[tp]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(cls: type[msgspec.Struct], path: str) -> str:
    """One Struct's heading line and table."""
    doc = " ".join((cls.__doc__ or "").split())
    lines = [
        f"**`{path}`** ({cls.__name__}): {doc}",
        "",
        "| key | type | definition |",
        "|---|---|---|",
    ]
    for name, tp, meta in field_docs(cls):
        text = meta.description or ""
        theory = (meta.extra or {}).get("theory")
        if theory:
            text += f". Closed form: `theory.{theory}`"
        lines.append(f"| `{name}` | {_cell(type_text(tp))} | {_cell(text)} |")
    return "\n".join(lines) + "\n"


def render(text: str) -> str:
    """``text`` with every generated block rewritten; ValueError when a Struct of the summary is
    in no block, in two, or a block names an unknown one."""
    paths = struct_paths()
    by_name = {cls.__name__: cls for cls in paths}
    seen: list[str] = []

    def fill(m: re.Match[str]) -> str:
        names = m["names"].split()
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"docs name Structs the summary does not have: {unknown}")
        seen.extend(names)
        body = "\n".join(table(by_name[n], paths[by_name[n]]) for n in names)
        return m.group(1) + "\n" + body + "\n" + m.group(4)

    out = BLOCK.sub(fill, text)
    missing = sorted(set(by_name) - set(seen))
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if missing or twice:
        raise ValueError(f"Structs in no generated block: {missing}; in two: {twice}")
    return out
