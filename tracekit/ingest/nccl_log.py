"""NCCL_DEBUG=INFO logs in: communicators, ring orders, trees, transports, tuning choices and
where each rank runs (:func:`read_nccl_logs`, :func:`rank_layout`, :func:`ring_order`).

What produces them: ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING
NCCL_DEBUG_FILE=<run>/nccl/%h.%p.log`` (one file per process), or a user's combined stdout. The
lines read: tracekit.ingest.nccl_lines; how they become rows: tracekit.ingest.nccl_records.

Files are streamed line by line (a 10k-rank job log is hundreds of MB; ``.gz`` is read too);
every line costs a few byte searches, and only lines holding a keyword of interest get the
prefix regex and one message regex, so the parse is linear in the input. Lines that are not
UTF-8 are skipped and counted; so are "lines" over 4 MiB (binary garbage).

Which rank runs on which node (``rank_layout``) comes from every source of placement at once:
INIT lines (host, localRank), nccl-tests headers (host), ``localRanks``/``nNodes``/``nranks``
(ranks the logs do not show); tracekit.ingest.nccl_placement derives it, and warns when the
logs cover only part of the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import polars as pl

from tracekit import guarded_read, runfolder
from tracekit.errors import TracekitError
from tracekit.ingest import nccl_lines as lines
from tracekit.ingest.kineto_files import MAX_BYTES_ENV, max_trace_bytes
from tracekit.ingest.nccl_placement import derive
from tracekit.ingest.nccl_records import Parser

_MAX_LINE = 1 << 22  # a longer "line" is binary garbage: skipped, counted
_NOT_LOGS = (".json", ".json.gz", ".pkl", ".pickle", ".pt", ".parquet", ".npz")

S, I, F = pl.Utf8, pl.Int64, pl.Float64
COMMS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "rank": I,
    "nranks": I,
    "nnodes": I,
    "local_rank": I,
    "local_ranks": I,
    "cuda_dev": I,
    "nvml_dev": I,
    "bus_id": S,
    "unique_id": S,
    "file": S,
}
RINGS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "nchannels": I,
    "order": pl.List(I),
    "nranks": I,
    "complete": pl.Boolean,
}
RING_LINKS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "rank": I,
    "prev": I,
    "next": I,
    "nranks": I,
}
TREES_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "rank": I,
    "up": I,
    "down": pl.List(I),
    "nranks": I,
}
TUNING_SCHEMA = {
    "host": S,
    "pid": I,
    "comm_id": S,
    "op": S,
    "nccl_op": S,
    "bytes": I,
    "algo": S,
    "proto": S,
    "time_us": F,
    "channel_lo": I,
    "channel_hi": I,
}
PLACEMENTS_SCHEMA = {
    "rank": I,
    "host": S,
    "pid": I,
    "device": I,
    "bus_id": S,
    "gpu": S,
    "group": I,
    "file": S,
    "line": I,
}
TRANSPORTS_SCHEMA = {
    "comm_id": S,
    "host": S,
    "pid": I,
    "channel": I,
    "src_rank": I,
    "dst_rank": I,
    "direction": S,
    "via": S,
    "transport": S,
    "nranks": I,
}


@dataclass(frozen=True)
class NcclLog:
    """Everything read from one or more NCCL_DEBUG logs (see the module docstring)."""

    files: tuple[str, ...]
    version: str | None
    comms: pl.DataFrame
    rings: pl.DataFrame
    trees: pl.DataFrame
    tuning: pl.DataFrame
    transports: pl.DataFrame
    warnings: tuple[str, ...]
    ring_links: pl.DataFrame
    placements: pl.DataFrame | None = None  # nccl-tests rank headers (PLACEMENTS_SCHEMA)


def _log_of(parser: Parser, files: list[str], warnings: list[str]) -> NcclLog:
    """The NcclLog of a finished parse: its rows as frames, and every warning."""
    comms = pl.DataFrame(list(parser.comms.values()), schema=COMMS_SCHEMA)
    rings = parser.rings.frame(parser.comms, RINGS_SCHEMA)
    truncated = 0
    if rings.height:
        rings = rings.with_columns(complete=_complete_expr())
        truncated = int((~rings["complete"]).sum())
    return NcclLog(
        files=tuple(files),
        version=parser.versions[0] if parser.versions else None,
        comms=comms,
        rings=rings,
        trees=parser.trees.frame(parser.comms, TREES_SCHEMA),
        tuning=pl.DataFrame(parser.tuning, schema=TUNING_SCHEMA),
        transports=parser.transports.frame(parser.comms, TRANSPORTS_SCHEMA),
        warnings=tuple(warnings + _warnings(parser, comms, truncated)),
        ring_links=parser.links.frame(parser.comms, RING_LINKS_SCHEMA),
        placements=pl.DataFrame(parser.placements, schema=PLACEMENTS_SCHEMA),
    )


def _warnings(parser: Parser, comms: pl.DataFrame, truncated_rings: int) -> list[str]:
    """One line per thing the parse skipped, found damaged or could not place."""
    out = []
    if parser.bad_lines:
        out.append(f"{parser.bad_lines} lines were not UTF-8 text and were skipped")
    if parser.long_lines:
        out.append(f"{parser.long_lines} lines longer than {_MAX_LINE} bytes were skipped")
    if len(parser.versions) > 1:
        out.append(f"several NCCL versions in one run: {', '.join(parser.versions)}")
    if truncated_rings:
        out.append(
            f"{truncated_rings} 'Channel xx/yy : ...' ring lines are incomplete "
            "(NCCL cuts long lines): their order is not used"
        )
    if comms.height == 0:
        out.append(
            "no communicator lines ('comm 0x.. rank .. nranks ..'): rank layout "
            + ("from nccl-tests rank headers only" if parser.placements else "unknown")
            + "; log with NCCL_DEBUG_SUBSYS including INIT"
        )
    if parser.n_cut:
        more = (
            f" (and {parser.n_cut - len(parser.cut)} more)"
            if parser.n_cut > len(parser.cut)
            else ""
        )
        out.append(
            f"{parser.n_cut} line{'s' if parser.n_cut > 1 else ''} cut off mid-text, parsed as "
            "far as they go: " + "; ".join(parser.cut) + more
        )
    if parser.n_warn:
        out.append(f"{parser.n_warn} NCCL WARN lines, first: {parser.nccl_warns[0]}")
    return out


def _complete_expr() -> pl.Expr:
    """A ring line is complete when it lists every rank 0..n-1 once (n = nranks when known)."""
    order = pl.col("order")
    n = pl.coalesce(pl.col("nranks"), order.list.len())
    return (
        (order.list.len() == n)
        & (order.list.n_unique() == n)
        & (order.list.max() == n - 1)
        & (order.list.min() == 0)
    ).fill_null(False)


@contextlib.contextmanager
def _open(path: Path) -> Iterator[io.BufferedIOBase]:
    """The log through the guarded reader's open: regular files only (a FIFO never blocks)."""
    try:
        fd = guarded_read.open_regular(path)
    except TracekitError as exc:
        raise guarded_read.Unread(f"NCCL log not read: {exc.problem}", path) from None
    with os.fdopen(fd, "rb") as raw:
        if not path.name.endswith(".gz"):
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as f:
            yield cast(io.BufferedIOBase, f)


def _raw_lines(f: io.BufferedIOBase, parser: Parser, path: Path) -> Iterator[bytes]:
    """Lines as bytes; an over-long run without a newline is skipped and counted. At most the
    trace size limit is read (a gzip bomb of a log stops there: one line, not hours)."""
    limit, _ = max_trace_bytes()
    total = 0
    while True:
        chunk = f.readline(_MAX_LINE)
        total += len(chunk)
        if total > limit:
            raise guarded_read.Unread(
                f"NCCL log not read: more than {limit / 1e9:.2f} GB of text, over the trace "
                f"size limit ({MAX_BYTES_ENV})",
                path,
            )
        if not chunk:
            return
        if len(chunk) == _MAX_LINE and not chunk.endswith(b"\n"):
            while chunk and not chunk.endswith(b"\n"):
                chunk = f.readline(_MAX_LINE)
                total += len(chunk)
            parser.long_lines += 1
            continue
        yield chunk


def _parse_file(path: Path, idx: int, parser: Parser) -> int:
    """Feed one file to the parser; returns how many NCCL lines it had."""
    found = 0
    name = str(path)
    with _open(path) as f:
        try:
            for lineno, raw in enumerate(_raw_lines(f, parser, path), 1):
                if not raw.isascii():
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        parser.bad_lines += 1
                        continue
                if b"NCCL" not in raw:
                    if b"Rank" in raw and b"#" in raw:  # nccl-tests' rank headers
                        parser.where = (name, lineno)
                        found += parser.header(raw.decode("utf-8"))
                    continue
                found += b"NCCL INFO" in raw or b"NCCL WARN" in raw or b"NCCL version" in raw
                if lines.KEYWORDS.search(raw):
                    parser.where = (name, lineno)
                    parser.line_len = len(raw.rstrip(b"\r\n"))
                    text = raw.decode("utf-8")
                    if not raw.endswith(b"\n") and b"NCCL INFO" in raw:
                        parser.cut_line("the file ends inside this line", text)
                    parser.line(text, idx, name)
        except (OSError, EOFError, zlib.error) as exc:
            raise TracekitError(f"cannot read NCCL log ({exc})", path) from None
    return found


def _log_files(paths_or_dir: Path | Sequence[Path]) -> tuple[list[Path], Path | None]:
    """The log files named: a file, a folder (run folders: their nccl/), or a list of either."""
    items = (
        [Path(paths_or_dir)]
        if isinstance(paths_or_dir, (str, Path))
        else [Path(p) for p in paths_or_dir]
    )
    files: list[Path] = []
    folder = items[0] if len(items) == 1 and items[0].is_dir() else None
    for item in items:
        if not item.exists():
            raise TracekitError("no such file or folder", item)
        if item.is_file():
            files.append(item)
            continue
        root = runfolder.nccl_dir(item) if runfolder.is_run_folder(item) else item
        files.extend(p for p in sorted(root.rglob("*")) if _is_log_file(p))
    if not files:
        raise TracekitError("no NCCL log files here", folder or items[0] if items else ".")
    return files, folder


def _is_log_file(path: Path) -> bool:
    name = path.name
    return path.is_file() and not name.startswith(".") and not name.endswith(_NOT_LOGS)


def read_nccl_logs(paths_or_dir: Path | Sequence[Path]) -> NcclLog:
    """Parse NCCL_DEBUG=INFO logs: one file, several, a folder, or a run folder (its nccl/)."""
    files, folder = _log_files(paths_or_dir)
    parser = Parser()
    warnings: list[str] = []
    total = 0
    for idx, path in enumerate(files):
        found = _parse_file(path, idx, parser)
        total += found
        if not found and len(files) > 1:
            warnings.append(f"{path.name}: no NCCL lines")
    if total == 0:
        what = f" ({parser.bad_lines} lines were not text)" if parser.bad_lines else ""
        raise TracekitError(
            f"no NCCL log lines ('host:pid:tid [dev] NCCL INFO ...') found{what}",
            files[0] if len(files) == 1 else folder or files[0],
        )

    log = _log_of(parser, [str(p) for p in files], warnings)
    layout_warnings = derive(log, _world(log))[1]
    return dataclasses.replace(log, warnings=log.warnings + tuple(layout_warnings))


def _world(log: NcclLog, nranks: int | None = None) -> pl.DataFrame:
    """Rows of the world communicator: the one with the most ranks (or exactly NRANKS)."""
    comms = log.comms
    if comms.height == 0:
        return comms
    n = nranks if nranks is not None else int(cast(int, comms["nranks"].max()))
    world = comms.filter(pl.col("nranks") == n)
    ids = world["unique_id"].drop_nulls()
    if ids.len():
        top = ids.value_counts(sort=True)["unique_id"][0]
        world = world.filter(pl.col("unique_id").is_null() | (pl.col("unique_id") == top))
    return world.sort("rank").unique("rank", keep="first", maintain_order=True)


def rank_layout(log: NcclLog) -> dict[int, dict]:
    """rank -> {host, node, local_rank, source} for the world communicator (the one with most
    ranks), from every source of placement: INIT lines, nccl-tests rank headers, localRanks
    (tracekit.ingest.nccl_placement; source "init", "nccl-tests" or "localRanks"). The one
    derivation of the layout: tracekit.ingest.load calls it."""

    return derive(log, _world(log))[0]


def ring_order(log: NcclLog, nranks: int | None = None) -> list[int] | None:
    """Ring 0's rank order for the largest communicator (or the one with NRANKS ranks).

    Sources, best first: a complete ``Channel 00/..`` line of that communicator; the ``Ring 00 :
    prev -> me -> next`` links of all its ranks; a complete unattributed ``Channel 00`` line of
    that size. None when no complete ring 0 is in the log (e.g. NCCL cut the line short).
    """
    world = _world(log, nranks)
    n = nranks if nranks is not None else (int(world["nranks"].item(0)) if world.height else None)
    rings = log.rings.filter((pl.col("channel") == 0) & pl.col("complete"))
    if n is not None:
        mine = rings.filter(pl.col("nranks") == n)
        if mine.height:
            return list(mine["order"][0])
        linked = _ring_from_links(log.ring_links, n)
        if linked is not None:
            return linked
        rings = rings.filter(pl.col("order").list.len() == n)
    if rings.height == 0:
        return None
    best = rings.with_columns(_len=pl.col("order").list.len()).sort("_len", descending=True)
    return list(best["order"][0])


def _ring_from_links(links: pl.DataFrame, n: int) -> list[int] | None:
    """Follow rank -> next around channel 0 when every rank 0..n-1 logged its link."""
    ch0 = links.filter(
        (pl.col("channel") == 0) & (pl.col("nranks").is_null() | (pl.col("nranks") == n))
    )
    nxt = {r: x for r, x in zip(ch0["rank"].to_list(), ch0["next"].to_list())}
    if len(nxt) != n or set(nxt) != set(range(n)):  # n is the log's word: sized by data only
        return None
    order, cur = [0], nxt[0]
    while cur != 0 and len(order) <= n:
        order.append(cur)
        cur = nxt.get(cur, -1)
    return order if cur == 0 and len(order) == n and sorted(order) == list(range(n)) else None
