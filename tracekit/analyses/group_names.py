"""How a process group is named wherever it is shown: by its dimension and its ranks.

c10d names groups by creation order ("0", "1", ...), which says nothing to a reader; the
parallel dimension (run.json ``process_groups[].dim``: shard, replicate, tp, dp, pp) and the
member ranks do. One function, used by summary.json (``label`` of ``collectives.per_group`` and
``traffic.by_group`` rows), the CLI and Markdown/HTML tables, the figures and the Dash pages:

    dim known           "shard {0,1}"        "replicate {0,2}"
    no dim, a desc      "default_pg {0,1}"   (the group's description: torch's own name)
    neither             "group 3 {0,1}"      (the c10d name, said to be one)
    point-to-point      "p2p 0->1"           (a direction, not a group)
    members unknown     "shard", "group 3"   (no braces: nothing is guessed)

Runs of three or more consecutive ranks are written as ranges: {0-7}, {0,2,4-6}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_NO_DESC = {"", "undefined", "none", "null"}


def ranks_text(ranks: Sequence[int] | None) -> str | None:
    """``{0,1}``, ``{0-7}``, ``{0,2,4-6}``; None when the members are unknown."""
    if ranks is None:
        return None
    rs = sorted({int(r) for r in ranks})
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{rs[i]}-{rs[j]}")
        else:
            parts.extend(str(r) for r in rs[i : j + 1])
        i = j + 1
    return "{" + ",".join(parts) + "}"


def group_label(
    group: Any = None,
    desc: str | None = None,
    dim: str | None = None,
    ranks: Sequence[int] | None = None,
) -> str:
    """A process group's name for people (see the module docstring)."""
    name = None if group is None else str(group)
    if name is not None and name.startswith("p2p "):
        return name
    if dim:
        head = str(dim)
    elif desc and str(desc).strip().lower() not in _NO_DESC:
        head = str(desc)
    elif name is not None:
        head = f"group {name}"
    else:
        head = "group ?"
    members = ranks_text(ranks)
    return f"{head} {members}" if members else head


def row_label(row: Mapping[str, Any]) -> str:
    """The label of a summary row that has group, desc (or group_desc), dim and ranks; a row
    written by an older tracekit without ``label`` gets the same text."""
    if row.get("label"):
        return str(row["label"])
    return group_label(
        row.get("group"),
        row.get("desc", row.get("group_desc")),
        row.get("dim"),
        row.get("ranks", row.get("group_ranks")),
    )
