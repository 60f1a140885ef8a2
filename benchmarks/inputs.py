"""Benchmark inputs: real Kineto traces replicated into 8-rank jobs.

- ``replicated``: 8 copies of $TRACEKIT_CORPUS/hta/nccl_parser_config/nccl_data.json.gz (a real
  2-rank A100/NCCL trace, rank 0: 9.8 MB of JSON, 40,573 events), ranks renumbered 0..7
  (``distributedInfo.rank``, ``world_size``, ``pg_config`` and the file name ``rank<R>.json.gz``).
- ``large``: the same, each rank's events repeated ``copies`` times one after another in time
  (``ts`` shifted by the trace's span, ``ProfilerStep#N`` renumbered, correlation / External id /
  flow ids offset so CPU launches still pair with their kernels): ~31 MB of JSON per rank.
- ``huge``: 2 ranks, the events repeated 40 times: ~405 MB of JSON and 1.62 M events per rank;
  ``huge1``: 1 rank of them repeated 200 times: ~2 GB of JSON (issue #29). Written copy by copy,
  so building them holds one copy of the events, not the whole rank.

Files are written the way Kineto writes them: the header keys first (so readers that peek at
the head find ``distributedInfo``), then one event per line, gzip-compressed. Each case is built
once into ``benchmarks/data/<case>/`` and rebuilt only when this generator's version changes.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from corpus_path import corpus

HERE = Path(__file__).resolve().parent


def _source() -> Path:
    """HTA's nccl_data (2 A100 ranks of an NCCL job) in the corpus (TRACEKIT_CORPUS)."""
    return corpus("hta", "nccl_parser_config", "nccl_data.json.gz")


VERSION = "3"  # bump when the generator changes: cached inputs are rebuilt
RANKS = 8
CASES = {"replicated": 1, "large": 3, "huge": 40, "huge1": 200}  # case -> copies in time
CASE_RANKS = {"huge": 2, "huge1": 1}  # the rest: RANKS


def _offset_event(event: dict, k: int, dt_us: float, id_off: int, steps: int) -> dict:
    """Copy ``k`` of an event: later by k*dt_us, ids and step numbers shifted past copy k-1."""
    if k == 0:
        return event
    # only top-level fields and args' ids change: a copy of those two dicts (deepcopy took
    # most of the time of building the 2 GB case)
    e = dict(event)
    if isinstance(e.get("args"), dict):
        e["args"] = dict(e["args"])
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * dt_us
    if "id" in e and isinstance(e["id"], int):
        e["id"] += k * id_off
    args = e.get("args")
    if isinstance(args, dict):
        for key in ("correlation", "External id", "Record function id"):
            if isinstance(args.get(key), int):
                args[key] += k * id_off
    name = e.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * steps}"
    return e


def _copies(trace: dict, copies: int) -> Iterator[list[dict]]:
    """The events of each copy in turn (copy k of every event, later by k spans)."""
    events = trace["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + e.get("dur", 0) for e in timed)
    dt_us = (hi - lo) + 1000.0  # 1 ms gap between copies
    ids = [e.get("id", 0) for e in events] + [
        v
        for e in events
        if isinstance(e.get("args"), dict)
        for k, v in e["args"].items()
        if k in ("correlation", "External id", "Record function id")
    ]
    id_off = 10 ** len(str(max(i for i in ids if isinstance(i, int))))
    steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    for k in range(copies):
        yield [
            _offset_event(e, k, dt_us, id_off, steps)
            for e in events
            if not (k and e.get("ph") in ("M", "i"))  # metadata and instants once
        ]


def _events(trace: dict, copies: int) -> list[dict]:
    return [e for part in _copies(trace, copies) for e in part]


def _event_text(e: dict) -> str:
    """One event as Kineto lays it out: its keys on one line, each ``args`` key on its own."""
    head = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e.items() if k != "args")
    if not isinstance(e.get("args"), dict):
        return "  {\n    " + head + "\n  }"
    args = ",\n".join(f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in e["args"].items())
    return "  {\n    " + head + ',\n    "args": {\n' + args + "\n    }\n  }"


def write_trace(trace: dict, path: Path, parts: Iterable[list[dict]] | None = None) -> None:
    """Kineto's layout: header keys one per line, then the events; gzip. ``parts``: the
    events in pieces (written as they come) instead of ``trace["traceEvents"]``."""
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    order = ["schemaVersion", "deviceProperties", "distributedInfo"]
    first = [k for k in order if k in head]
    rest = [k for k in head if k not in order]
    lines = ["{"]
    lines += [f'  "{k}": {json.dumps(head[k])},' for k in first]
    lines.append('  "traceEvents": [')
    tail = ["  ]" + ("," if rest else "")]
    tail += [
        f'  "{k}": {json.dumps(head[k])}' + ("," if i + 1 < len(rest) else "")
        for i, k in enumerate(rest)
    ]
    tail.append("}")
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", compresslevel=6) as f:
        f.write("\n".join(lines) + "\n")
        sep = ""
        for part in parts if parts is not None else [trace["traceEvents"]]:
            if part:
                f.write(sep + ",\n".join(_event_text(e) for e in part))
                sep = ",\n"
        f.write("\n" + "\n".join(tail) + "\n")
    tmp.replace(path)


def _write_gz(path: Path, text: str) -> None:
    with gzip.open(path, "wt", compresslevel=6) as f:
        f.write(text)


def _dist_info(source: dict, rank: int, ranks: int) -> dict:
    info = copy.deepcopy(source["distributedInfo"])
    info.update(rank=rank, world_size=ranks)
    for pg in info.get("pg_config", []):
        pg.update(pg_size=ranks, ranks=list(range(ranks)))
    return info


def _renumbered_text(raw: str, source: dict, rank: int, ranks: int) -> str:
    """The original text with its distributedInfo and traceName lines replaced."""
    old_info = '"distributedInfo": ' + json.dumps(source["distributedInfo"])
    old_name = '"traceName": ' + json.dumps(source["traceName"])
    assert raw.count(old_info) == 1 and raw.count(old_name) == 1, "unexpected source layout"
    return raw.replace(
        old_info, '"distributedInfo": ' + json.dumps(_dist_info(source, rank, ranks))
    ).replace(old_name, '"traceName": ' + json.dumps(f"rank{rank}.json"))


def build(case: str, root: Path | None = None, ranks: int | None = None) -> Path:
    """The folder of ``case``'s trace files, built if missing or stale; returns its path."""
    ranks = ranks or CASE_RANKS.get(case, RANKS)
    folder = (root or HERE / "data") / case
    stamp = folder / ".version"
    want = f"{VERSION} {ranks} {_source().stat().st_size}"
    if stamp.is_file() and stamp.read_text() == want:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    raw = gzip.decompress(_source().read_bytes()).decode()
    source = json.loads(raw)
    if CASES[case] == 1:  # the real file's own text, only the rank's lines rewritten
        for r in range(ranks):
            _write_gz(folder / f"rank{r}.json.gz", _renumbered_text(raw, source, r, ranks))
        stamp.write_text(want)
        return folder
    for r in range(ranks):
        trace = {k: v for k, v in source.items() if k != "traceEvents"}
        trace["distributedInfo"] = _dist_info(source, r, ranks)
        trace["traceName"] = f"rank{r}.json"
        write_trace(trace, folder / f"rank{r}.json.gz", _copies(source, CASES[case]))
    stamp.write_text(want)
    return folder


def describe(folder: Path) -> dict:
    """Files, gzip bytes and JSON bytes of a built case."""
    files = sorted(folder.glob("rank*.json.gz"))
    json_bytes = 0
    for f in files:
        with gzip.open(f, "rb") as g:
            while chunk := g.read(1 << 24):
                json_bytes += len(chunk)
    return {
        "files": len(files),
        "gz_bytes": sum(f.stat().st_size for f in files),
        "json_bytes": json_bytes,
    }


if __name__ == "__main__":  # `python benchmarks/inputs.py [CASE ...]`: default the small two
    for name in sys.argv[1:] or ["replicated", "large"]:
        d = build(name)
        print(name, d, describe(d))
