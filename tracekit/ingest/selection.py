"""Which trace files to read: ``--ranks`` (a subset) and ``--sample N`` (an overview of a big job).

A file's rank is known before parsing it from, in order: ``distributedInfo.rank`` in the head
of the file (Kineto writes it before the events: kineto_info.peek_rank reads at most 64 KB), a
matching cache entry (tracekit.cache), the ``rank<N>`` of its name. Files whose rank none of
these tell are read in full and filtered afterwards (the only way to learn their rank).

Sampling, for thousand-rank jobs: N ranks spread evenly over the ranks present, always the
first and the last (the ranks at positions floor(k (M-1)/(N-1) + 1/2), k = 0..N-1, of the M
ranks sorted),
so the overview sees both ends of every pipeline and both edges of the node layout. Every
number then covers the sampled ranks only, and the summary says so (``sampling``, warnings).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.ingest.foreign import ranges
from tracekit.ingest.kineto_info import peek_rank
from tracekit.runfolder import rank_from_filename

RANK_MAX = 2**31 - 1  # ranks are Int32 in every table
_PART = re.compile(r"^(\d{1,12})(?:-(\d{1,12}))?$")


class RankSet:
    """A set of ranks as sorted, merged ``(lo, hi)`` intervals (inclusive): ``--ranks
    0-2000000000`` is two numbers, tested by bisection, never a list of two billion ranks."""

    def __init__(self, intervals: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for lo, hi in sorted(intervals):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.intervals = [(lo, hi) for lo, hi in merged]
        self._starts = [lo for lo, _ in self.intervals]

    @classmethod
    def parse(cls, text: str) -> RankSet:
        """``0,1,4-7`` -> RankSet; ValueError with a one-line reason for anything else."""
        out = []
        for part in text.split(","):
            part = part.strip()
            match = _PART.match(part)
            if match is None:
                if re.match(r"^\d+(-\d+)?$", part):
                    raise ValueError(f"{part!r}: rank too large (ranks go up to {RANK_MAX})")
                raise ValueError(f"{part!r} is not a rank or a range like 4-7 (list: 0,1,4-7)")
            lo = int(match.group(1))
            hi = int(match.group(2)) if match.group(2) is not None else lo
            if max(lo, hi) > RANK_MAX:
                raise ValueError(f"{part!r}: rank too large (ranks go up to {RANK_MAX})")
            if hi < lo:
                raise ValueError(f"{part!r} goes down; write {hi}-{lo}")
            out.append((lo, hi))
        return cls(out)

    @classmethod
    def of(cls, ranks: RankSet | Iterable[int] | None) -> RankSet | None:
        """A RankSet from one, or from a list of ranks; None for None or an empty list."""
        if ranks is None or isinstance(ranks, RankSet):
            return ranks or None
        got = cls((int(r), int(r)) for r in ranks)
        return got or None

    def __contains__(self, rank: object) -> bool:
        if not isinstance(rank, int):
            return False
        i = bisect.bisect_right(self._starts, rank) - 1
        return i >= 0 and rank <= self.intervals[i][1]

    def __bool__(self) -> bool:
        return bool(self.intervals)

    def __str__(self) -> str:
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.intervals)


@dataclass
class Selection:
    files: list[Path]  # to read
    unknown: list[Path] = field(default_factory=list)  # rank unknown before parsing (in files)
    sampled: list[int] | None = None  # the sampled ranks, when --sample chose
    ranks_present: int = 0  # distinct ranks known before parsing
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict | None:
        if self.sampled is None:
            return None
        return {
            "ranks_present": self.ranks_present,
            "ranks_analysed": len(self.sampled),
            "ranks": self.sampled,
            "method": "evenly spaced over the ranks present, first and last included",
        }


def file_rank(path: Path, cache_dir: Path | None = None) -> int | None:
    """A file's rank without parsing it: head, then cache entry, then file name; else None."""
    rank = peek_rank(path)
    if rank is not None:
        return rank
    from tracekit import cache

    found = cache.lookup(path, cache_dir)
    if found is not None:
        info = found[1].get("info") or {}
        if info.get("rank_source") in ("distributedInfo", "filename") and isinstance(
            info.get("rank"), int
        ):
            return info["rank"]
    return rank_from_filename(path.name)


def spread(ranks: Sequence[int], n: int) -> list[int]:
    """n of the sorted ranks, evenly spaced, first and last included (all when n >= len)."""
    ranks = sorted(set(ranks))
    if n >= len(ranks):
        return ranks
    if n == 1:
        return ranks[:1]
    m = len(ranks)
    return sorted({ranks[int(k * (m - 1) / (n - 1) + 0.5)] for k in range(n)})  # half up


def select(
    files: Sequence[Path],
    ranks: RankSet | Sequence[int] | None = None,
    sample: int | None = None,
    cache_dir: Path | None = None,
) -> Selection:
    """The files to read for ``ranks`` (a subset) and/or ``sample`` (N ranks spread out).
    JSON files that are not Kineto traces are left out with a warning (tracekit.ingest.nonkineto)."""
    from tracekit.ingest import nonkineto

    files, skipped = nonkineto.split(list(files))
    skip_note = [nonkineto.skipped_warning(skipped)] if skipped else []
    if not ranks and not sample:
        return Selection(files=files, warnings=skip_note)
    known: dict[Path, int] = {}
    unknown: list[Path] = []
    for f in files:
        r = file_rank(f, cache_dir)
        if r is None:
            unknown.append(f)
        else:
            known[f] = r
    present = sorted(r for r in set(known.values()) if ranks is None or r in ranks)
    wanted = set(present)
    sel = Selection(files=[], ranks_present=len(set(known.values())), warnings=skip_note)
    if sample:
        chosen = spread(present, sample)
        sel.sampled = chosen
        scope = f"of the {len(present)} ranks asked for" if ranks else f"of {len(present)} ranks"
        sel.warnings.append(
            f"sampled overview: {len(chosen)} {scope} analysed (ranks {ranges(chosen)}); every "
            "number covers these ranks only"
        )
        if unknown:
            sel.warnings.append(
                f"{len(unknown)} trace files say their rank only inside (no distributedInfo in their "
                "head, no rank<N> in their name): left out of the sample"
            )
            unknown = []
        wanted = set(chosen)
    sel.files = [f for f in files if known.get(f) in wanted] + unknown
    sel.unknown = unknown
    return sel
