"""Jobs of many ranks from real traces: renumbered copies (tests/test_dask.py, benchmarks/scale.py).

Rank r of the new job is a copy of source ``r mod len(sources)``: the file's own text with only
its ``distributedInfo`` object rewritten (``rank``, ``world_size``, and every group of
``pg_config`` spanning the new world, so give sources that use the default group only) and its
``traceName``, written as ``rank<r>.json.gz``. The events are the real ones, byte for byte, in
Kineto's own layout (``distributedInfo`` stays in the file's head, where ingest peeks for it).

    python benchmarks/renumber.py sample_traces/dp/traces/rank*.json.gz --ranks 16 --out /tmp/j16
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path

_DECODER = json.JSONDecoder()


def _value_span(text: str, key: str) -> tuple[int, int, object] | None:
    """(start, end, value) of the JSON value of the first ``"key":`` in ``text``, or None."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:\s*', text)
    if m is None:
        return None
    value, end = _DECODER.raw_decode(text, m.end())
    return m.end(), end, value


def renumbered(text: str, rank: int, world: int) -> str:
    """A trace's text as rank ``rank`` of ``world`` ranks (module docstring)."""
    found = _value_span(text, "distributedInfo")
    if found is None or not isinstance(found[2], dict):
        raise ValueError("the source trace has no distributedInfo object")
    start, end, info = found
    info = {**info, "rank": rank, "world_size": world}
    if isinstance(info.get("pg_config"), list):
        info["pg_config"] = [
            {**pg, "pg_size": world, "ranks": list(range(world))} for pg in info["pg_config"]
        ]
    text = text[:start] + json.dumps(info) + text[end:]
    name = _value_span(text, "traceName")
    if name is not None:
        text = text[: name[0]] + json.dumps(f"rank{rank}.json") + text[name[1] :]
    return text


def build(sources: Sequence[Path], ranks: int, folder: Path, level: int = 1) -> list[Path]:
    """``folder``/rank0..rank<ranks-1>.json.gz from ``sources`` (gzip ``level``: 1 builds fast
    and reads back as fast as any); returns the files in rank order."""
    texts = [gzip.decompress(Path(s).read_bytes()).decode() for s in sources]
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for r in range(ranks):
        path = folder / f"rank{r}.json.gz"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(gzip.compress(renumbered(texts[r % len(texts)], r, ranks).encode(), level))
        tmp.replace(path)
        files.append(path)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path, help="Kineto traces (.json.gz)")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    files = build(args.sources, args.ranks, args.out)
    print(f"{len(files)} ranks in {args.out}")


if __name__ == "__main__":
    main()
