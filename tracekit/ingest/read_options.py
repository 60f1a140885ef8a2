"""How a path is read: the options of `tracekit analyze`, given once and handed down whole.

    ReadOptions(ranks=RankSet.parse("0,4-7"), cache=True)    the CLI builds one from its flags;
    analyze(path, ranks=[0, 4], cache=True)                    analyze() from its keywords

The same object goes from the CLI or ``tracekit.analyze`` to the read-ahead, the loader
(tracekit.ingest.load: which ranks, which topology), the per-file read (tracekit.ingest.rank_scan:
workers, cache) and the timeline step (clock alignment), so an option is declared once, here,
and no signature between them lists them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # selection imports polars: the CLI builds these options before it does
    from tracekit.ingest.selection import RankSet


@dataclass(frozen=True)
class ReadOptions:
    """What to read of a path, and how (every field optional: None is tracekit's choice)."""

    ranks_per_node: int | None = None
    """The topology, when nothing in the folder says it: rank r is on node r // N."""
    ranks: RankSet | None = None
    """Read only these ranks' traces (``--ranks 0,4-7``; tracekit.ingest.selection)."""
    sample: int | None = None
    """Read N ranks spread over the job, first and last included: a sampled overview."""
    workers: int | None = None
    """Processes or threads for the per-file parse and the per-rank map (None: tracekit's rule)."""
    cache: bool | None = None
    """Parsed events as parquet (tracekit.ingest.cache): None reads entries that match the traces
    and writes none; True also writes one for each trace parsed; False neither."""
    cache_dir: Path | None = None
    """Where cache entries are (default the per-user cache folder, or beside the traces when
    their run wrote them)."""
    align_clocks: bool | None = None
    """None aligns rank clocks when the traces come from several hosts, True always, False never
    (tracekit.clock; the offsets are in summary ``clock`` either way)."""
    scheduler: str | None = None
    """Where the per-rank work runs: "threads", "processes" or a Dask scheduler address
    (tracekit.engines); None: tracekit chooses (``$TRACEKIT_SCHEDULER`` if set)."""

    @classmethod
    def of(
        cls,
        *,
        ranks_per_node: int | None = None,
        ranks: RankSet | Sequence[int] | None = None,
        sample: int | None = None,
        workers: int | None = None,
        cache: bool | None = None,
        cache_dir: Path | str | None = None,
        align_clocks: bool | None = None,
        scheduler: str | None = None,
    ) -> ReadOptions:
        """From plain values (``ranks`` a list of ranks, ``cache_dir`` a string)."""
        from tracekit.ingest.selection import RankSet

        return cls(
            ranks_per_node=ranks_per_node,
            ranks=RankSet.of(ranks),
            sample=sample,
            workers=workers,
            cache=cache,
            cache_dir=None if cache_dir is None else Path(cache_dir),
            align_clocks=align_clocks,
            scheduler=scheduler,
        )

    @property
    def subset(self) -> bool:
        """Only some ranks were asked for (``ranks`` or ``sample``)."""
        return bool(self.ranks) or bool(self.sample)
