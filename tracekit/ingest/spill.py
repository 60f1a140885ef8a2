"""Where one rank's frames wait between the per-rank steps: in memory, or in a parquet file.

The analysis is a per-rank map and a cross-rank reduce (tracekit.analyses.rank_map): the
driver keeps only small per-rank results, so a rank's events (and its merged timeline) must
wait somewhere else between the read and the per-rank timeline step, and until a user asks for
them (Analysis.events, the zoomed-in timeline). An :class:`EventsRef` is that place: a frame
held in this process, or a parquet file (a cache entry, a rank's ingest-at-source entry, or a
file spilled into the analysis's own scratch folder).

:class:`Spill` decides: frames are held in memory while their total stays under a budget
(``$TRACEKIT_MEMORY_BUDGET`` bytes, default 64 MiB: the whole of a small job, as before), and
written to its folder after that, so the driver's memory stops growing with the ranks. Ranks
read in worker processes or on a Dask cluster always go to the folder (a frame returned to the
driver would be held there); the folder must then be one the workers share with the driver
(tracekit.analysis picks the cache folder for a Dask cluster). The folder is ours
(``.tracekit-spill.tmp-<pid>-<token>``, tracekit.outputs' temporary name); :meth:`Spill.close`
(or the end of the process) removes it and nothing else. An analysis killed before it could
leaves it behind: in this machine's temporary folder, the next analysis removes those of
processes that are gone (tracekit.outputs.sweep); a shared folder is not swept (another host's
live analysis would look gone from here).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from tracekit import outputs
from tracekit.errors import TracekitError

DEFAULT_BUDGET = 64 * 2**20
PREFIX = ".tracekit-spill.tmp-"  # outputs.temp_name(root / "tracekit-spill", folder=True)


def budget_from_env() -> int:
    """``$TRACEKIT_MEMORY_BUDGET`` (bytes of events held in the driver), else 64 MiB."""
    text = os.environ.get("TRACEKIT_MEMORY_BUDGET", "").strip()
    if not text:
        return DEFAULT_BUDGET
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise TracekitError(
            f"TRACEKIT_MEMORY_BUDGET must be a number of bytes (0 or more), not {text!r}"
        )
    return value


@dataclass(frozen=True)
class EventsRef:
    """One rank's frame: held here (``frame``) or in a parquet file (``path``)."""

    frame: pl.DataFrame | None = None
    """The frame itself, when it is held in memory."""
    path: str | None = None
    """A parquet file holding it (a string: it crosses to Dask workers as it is)."""
    parts: tuple[str, ...] = ()
    """Or parquet files holding it in row order (a rank read in parts: tracekit.ingest.kineto_stream)."""

    def read(self, columns: Sequence[str | pl.Expr] | None = None) -> pl.DataFrame:
        """The frame, or when given only ``columns`` of it: the named ones it has, and
        expressions of them (a file is read in a streaming pass that holds no other column);
        a one-line TracekitError when its file has gone (a cache entry evicted by another
        process meanwhile)."""
        if self.frame is not None:
            if columns is None:
                return self.frame
            return self.frame.select(_present(columns, self.frame.columns))
        try:
            if columns is not None:
                scan = self.lazy()
                wanted = _present(columns, scan.collect_schema().names())
                return scan.select(wanted).collect(engine="streaming")
            return pl.read_parquet(self._files())
        except (OSError, pl.exceptions.ComputeError) as exc:
            where = self.path or self.parts[0]
            raise TracekitError(f"cannot read back a rank's events ({exc})", where) from None

    def lazy(self) -> pl.LazyFrame:
        """The frame as a lazy scan (the file is read when the plan runs)."""
        if self.frame is not None:
            return self.frame.lazy()
        return pl.scan_parquet(self._files())

    def _files(self) -> list[str] | str:
        assert self.path is not None or self.parts
        return list(self.parts) if self.parts else str(self.path)


def _present(columns: Sequence[str | pl.Expr], have: Sequence[str]) -> list[str | pl.Expr]:
    return [c for c in columns if not isinstance(c, str) or c in have]


class Spill:
    """A memory budget for per-rank frames and, past it, a scratch folder for them."""

    def __init__(self, root: Path | None = None, budget: int | None = None) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir())
        self.budget = budget_from_env() if budget is None else budget
        self._held = 0
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def folder(self) -> Path:
        """The scratch folder, made on first use (:data:`PREFIX` under the root)."""
        with self._lock:
            if self._folder is None:
                try:
                    self.root.mkdir(parents=True, exist_ok=True)
                    if self.root == Path(tempfile.gettempdir()):
                        outputs.sweep(self.root)  # those of analyses killed on this machine
                    folder = outputs.temp_name(self.root / "tracekit-spill", folder=True)
                    outputs.make_owned_folder(folder, mode=0o700)
                    self._folder = folder
                except OSError as exc:
                    raise TracekitError(
                        f"cannot make a scratch folder for per-rank results ({exc.strerror})",
                        self.root,
                    ) from None
                self._finalizer = weakref.finalize(self, _remove, self._folder)
            return self._folder

    def hold(self, nbytes: int) -> bool:
        """Count NBYTES against the budget: True when they fit (hold the frame in memory)."""
        with self._lock:
            if self._held + nbytes > self.budget:
                return False
            self._held += nbytes
            return True

    def close(self) -> None:
        """Remove the scratch folder (only it: the :data:`PREFIX` folder made here)."""
        if self._finalizer is not None:
            self._finalizer()


def write(frame: pl.DataFrame, folder: str | Path, stem: str) -> EventsRef:
    """FRAME written to a new file ``<stem>-<random>.parquet`` in FOLDER (a spill folder, which
    tasks on several machines may write into at once: the name is random, not counted), lz4:
    as fast to write as none, a third of the size."""
    path = str(Path(folder) / f"{stem}-{uuid.uuid4().hex}.parquet")
    try:
        frame.write_parquet(path, compression="lz4", statistics=False)
    except OSError as exc:
        raise TracekitError(
            f"cannot write a rank's per-rank result ({exc.strerror})", path
        ) from None
    return EventsRef(path=path)


def _remove(folder: Path) -> None:
    if folder.name.startswith(PREFIX):
        shutil.rmtree(folder, ignore_errors=True)
