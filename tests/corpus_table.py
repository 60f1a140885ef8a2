"""The corpus cases and docs/corpus.md's parity table: tracekit's idle and compute per rank of
every trace in the public corpus beside HTA's definitions recomputed (tests/corpus_reference.py).

Run: TRACEKIT_CORPUS=DEST python tests/corpus_table.py   (rewrites the table in docs/corpus.md)

tests/test_corpus.py asserts each case and that the committed table is what this writes.

Cases: every Kineto trace of the corpus alone, and every folder that holds a job's ranks
(distinct distributedInfo ranks, one world size > 1) or a Kineto trace beside other JSON (an
execution trace), analysed as the folder: a user's two ways of pointing tracekit at them.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from corpus_reference import breakdown, load

from tracekit.analysis import Analysis, analyze

DOCS = Path(__file__).resolve().parents[1] / "docs" / "corpus.md"
BEGIN = "<!-- corpus-table: written by `python tests/corpus_table.py`; do not edit -->"
END = "<!-- corpus-table end -->"


@dataclass(frozen=True)
class Case:
    name: str  # relative to the corpus root; a folder ends in "/"
    path: Path  # what tracekit analyses
    files: tuple[Path, ...]  # its Kineto traces


def kineto(path: Path) -> dict | None:
    """The trace, or None for any other JSON (execution traces, memory timelines)."""
    try:
        data = load(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "traceEvents" in data else None


@functools.cache
def cases(root: Path) -> tuple[Case, ...]:
    out: list[Case] = []
    folders: dict[Path, tuple[list[Path], int]] = {}  # Kineto traces, other JSON files
    for f in sorted(root.rglob("*.json*")):
        traces, other = folders.get(f.parent, ([], 0))
        if kineto(f) is not None:
            traces.append(f)
            out.append(Case(str(f.relative_to(root)), f, (f,)))
        else:
            other += 1
        folders[f.parent] = (traces, other)
    for folder, (traces, other) in folders.items():
        if traces and (_one_job(traces) or other):
            out.append(Case(f"{folder.relative_to(root)}/", folder, tuple(traces)))
    return tuple(sorted(out, key=lambda c: c.name))


def _one_job(files: list[Path]) -> bool:
    dists = [(kineto(f) or {}).get("distributedInfo") or {} for f in files]
    ranks = [d.get("rank") for d in dists]
    worlds = {d.get("world_size") for d in dists}
    return (
        len(files) > 1
        and None not in ranks
        and len(set(ranks)) == len(files)
        and len(worlds) == 1
        and (worlds.pop() or 0) > 1
    )


@dataclass(frozen=True)
class Row:
    case: str
    file: str
    device: str
    ranks: int
    rank: int | None
    idle: float  # tracekit, percent of the span
    compute: float
    ref_idle: float | None  # HTA's definitions recomputed; None: no device events
    ref_compute: float | None
    shows_device: bool  # runtime launches or deviceProperties, whatever the events

    @property
    def delta(self) -> float | None:
        if self.ref_idle is None or self.ref_compute is None:
            return None
        return max(abs(self.idle - self.ref_idle), abs(self.compute - self.ref_compute))


@functools.cache
def analysed(case: Case) -> tuple[Analysis, tuple[Row, ...]]:
    """tracekit's analysis of one case (once per process) and its rows, one per trace."""
    result = analyze(case.path, cache=False)
    by_rank = {r.rank: r for r in result.summary.ranks}
    rows = []
    for f in case.files:
        trace = kineto(f) or {}
        ref = breakdown(trace)
        rank = ref.rank if ref.rank is not None and len(case.files) > 1 else None
        got = by_rank[rank] if rank is not None else next(iter(by_rank.values()))
        rows.append(
            Row(
                case.name,
                f.name,
                _device(trace),
                len(case.files),
                got.rank,
                100 * got.idle_s / got.span_s,
                100 * got.compute_s / got.span_s,
                ref.idle_pct,
                ref.compute_pct,
                shows_device(trace),
            )
        )
    return result, tuple(rows)


def shows_device(trace: dict) -> bool:
    """Runtime calls that launch device work, or listed devices."""
    launch = ("LaunchKernel", "Memcpy", "Memset", "runFunction")
    runtime = any(
        str(e.get("cat", "")).lower() in ("cuda_runtime", "runtime", "mtia_runtime")
        and any(k in str(e.get("name", "")) for k in launch)
        for e in trace["traceEvents"]
    )
    return runtime or bool(trace.get("deviceProperties"))


def _device(trace: dict) -> str:
    props = trace.get("deviceProperties") or []
    names = sorted({str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")})
    return ", ".join(names) or "–"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def table(root: Path) -> str:
    lines = [
        "| case | trace | device (deviceProperties) | ranks | rank | tracekit idle % | "
        "tracekit compute % | recomputed idle % | recomputed compute % | difference (points) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases(root):
        for r in analysed(case)[1]:
            diff = "CPU rules (no device events)" if r.delta is None else f"{r.delta:.2f}"
            lines.append(
                f"| {r.case} | {r.file} | {r.device} | {r.ranks} | {r.rank} | {_pct(r.idle)} | "
                f"{_pct(r.compute)} | {_pct(r.ref_idle)} | {_pct(r.ref_compute)} | {diff} |"
            )
    return "\n".join(lines)


def with_table(docs: str, root: Path) -> str:
    """docs/corpus.md's text with the block between BEGIN and END written anew."""
    head, rest = docs.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(root)}\n{END}{tail}"


def main() -> int:
    from builders import corpus_root

    why = corpus_root.missing()
    if why:
        print(f"corpus_table: {why}", file=sys.stderr)
        return 2
    DOCS.write_text(with_table(DOCS.read_text(encoding="utf-8"), corpus_root.CORPUS), "utf-8")
    print(f"{DOCS}: {len(cases(corpus_root.CORPUS))} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
