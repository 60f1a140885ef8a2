"""How a summary.json field is declared: a typed Struct field with one description.

Every field is ``Annotated[T, M("what it counts, its unit, when it is null")]``; ``M(...,
theory="name")`` names the tracekit.theory function that gives the papers' closed form for it.
tracekit.summary.markdown reads these back (``field_docs``) to write docs/metrics.md.
"""

from __future__ import annotations

from typing import Any, get_type_hints

import msgspec


def M(description: str, theory: str | None = None) -> msgspec.Meta:
    """A field's one definition; ``theory``: the tracekit.theory function of its closed form."""
    return msgspec.Meta(description=description, extra={"theory": theory} if theory else None)


class Record(msgspec.Struct, forbid_unknown_fields=True):
    """A summary.json object: its fields in the order analyze() writes them, none unknown."""


def field_docs(cls: type[msgspec.Struct]) -> list[tuple[str, Any, msgspec.Meta]]:
    """(name, type, meta) of each field of ``cls`` in order; a field without M() is an error."""
    hints = get_type_hints(cls, include_extras=True)
    out = []
    for name in cls.__struct_fields__:
        hint = hints[name]
        metas = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, msgspec.Meta)]
        if not metas or not metas[0].description:
            raise TypeError(f"{cls.__name__}.{name} has no description (M(...))")
        out.append((name, hint.__origin__, metas[0]))
    return out
