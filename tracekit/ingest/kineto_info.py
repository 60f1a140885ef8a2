"""What one trace says about itself (:class:`TraceInfo`), and TraceInfo as JSON.

Besides its events a trace tells its rank, world size, backend, host, clock base, process
groups (``distributedInfo.pg_config``) and device properties; ingest adds whether it holds
device work, how many profiler steps, the peak memory per device, and one warning per thing it
had to drop or guess. :func:`encode_info` / :func:`decode_info` carry a TraceInfo across
worker processes and into cache entries (tracekit.ingest.cache imports this module; nothing here
imports the cache).

Ranks: ``distributedInfo.rank``, else the ``rank`` argument, else ``rank<N>``/``rank-<N>``/
``rank_<N>`` in the file name (runfolder.rank_from_filename; never other digits), else 0 with
a warning. Kineto writes ``distributedInfo`` before the events, so :func:`peek_rank` reads it
from the first 64 KB of a file: selecting ranks costs milliseconds per file, not a parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit import guarded_read
from tracekit.errors import TracekitError
from tracekit.ingest.kineto_decode import RawArgs, Trace, full_args, series
from tracekit.ingest.kineto_files import HEAD_BYTES, read_head
from tracekit.runfolder import rank_from_filename

_RANK_LIMIT = 2**31
NO_RANK_WARNING = "no rank in distributedInfo or file name; taken as rank 0"


@dataclass(frozen=True)
class TraceInfo:
    """What one trace file says about itself, and what ingest had to drop or guess."""

    path: Path
    rank: int
    rank_source: str  # "distributedInfo" | "argument" | "filename" | "default"
    world_size: int | None
    backend: str | None  # "gloo" | "nccl" | ...
    host_name: str | None
    base_ns: int | None  # baseTimeNanoseconds
    pg_config: tuple[dict, ...]  # distributedInfo.pg_config as given
    device_properties: tuple[dict, ...]
    has_gpu: bool  # any device work: kernel / gpu_memcpy / gpu_memset / mtia_ccp_events events
    profiler_steps: int  # number of ProfilerStep#N annotations
    warnings: tuple[str, ...]  # one line each: what is missing or was dropped
    # device ('cpu', 'cuda:0', ...) -> max 'Total Allocated' of the profiler's [memory] events
    memory_peak_bytes: dict[str, int] = field(default_factory=dict)


def encode_info(info: TraceInfo) -> bytes:
    """TraceInfo as JSON bytes (worker results, cache entries)."""
    return msgspec.json.encode(info, enc_hook=str)


def decode_info(data: bytes) -> TraceInfo:
    return msgspec.json.decode(
        data, type=TraceInfo, dec_hook=lambda typ, obj: Path(obj) if typ is Path else obj
    )


# --- what the file says ---------------------------------------------------------------------


def _as_int(value: Any, low: int, high: int) -> int | None:
    """An int in [low, high) or None (bools, floats, text and huge values are not ranks)."""
    return value if type(value) is int and low <= value < high else None


def _dicts(value: Any) -> tuple[dict, ...] | None:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return tuple(value)
    return None


def trace_meta(trace: Trace, warnings: list[str]) -> dict[str, Any]:
    """distributedInfo, host and clock base, each checked; oddities become warnings."""
    dist = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    if trace.distributedInfo is not None and not dist:
        warnings.append("distributedInfo is not an object; ignored")
    raw_rank = dist.get("rank")
    rank = _as_int(raw_rank, 0, _RANK_LIMIT)
    if raw_rank is not None and rank is None:
        warnings.append(f"distributedInfo.rank {str(raw_rank)[:40]!r} is not a rank; ignored")
    pg_config = _dicts(dist.get("pg_config"))
    if pg_config is None:
        warnings.append("distributedInfo.pg_config is not a list of objects; ignored")
        pg_config = ()
    world = _as_int(dist.get("world_size"), 1, _RANK_LIMIT + 1)
    pg_config = tuple(_checked_group(g, world, warnings) for g in pg_config)
    devices = _dicts(trace.deviceProperties)
    if devices is None:
        warnings.append("deviceProperties is not a list of objects; ignored")
        devices = ()
    base = trace.baseTimeNanoseconds
    if isinstance(base, str) and base.strip().isdigit():  # MTIA traces write it as text
        base = int(base)
    base_ns = _as_int(base, -(2**62), 2**62)
    if base is not None and base_ns is None:
        warnings.append(
            f"baseTimeNanoseconds {str(base)[:40]!r} is not usable; times taken as given"
        )
    backend, host = dist.get("backend"), trace.host_name
    return {
        "rank": rank,
        "world_size": world,
        "backend": backend if isinstance(backend, str) else None,
        "host_name": host if isinstance(host, str) else None,
        "base_ns": base_ns,
        "pg_config": pg_config,
        "device_properties": devices,
    }


def _checked_group(group: dict, world: int | None, warnings: list[str]) -> dict:
    """GROUP (one pg_config entry) with the numbers that size or index something range-checked
    first: a pg_size that is not a count of ranks of this world (2^31, 2^63), or ranks outside the
    world or not ints (``[0, 5]`` of a world of 2, ``[0, "x"]``), are dropped with a warning."""
    out = dict(group)
    name = str(group.get("pg_name"))[:40]
    size = group.get("pg_size")
    top = (world if world is not None else _RANK_LIMIT) + 1
    if size is not None and guarded_read.in_range(size, 1, top) is None:
        warnings.append(
            f"distributedInfo.pg_config group {name!r}: pg_size {str(size)[:40]!r} is not a "
            f"group size{_of_world(world)}; ignored"
        )
        del out["pg_size"]
    ranks = group.get("ranks")
    if ranks not in (None, []) and guarded_read.rank_list(ranks, world) is None:
        warnings.append(
            f"distributedInfo.pg_config group {name!r}: ranks {str(ranks)[:60]!r} are not "
            f"ranks{_of_world(world)}; ignored"
        )
        del out["ranks"]
    return out


def _of_world(world: int | None) -> str:
    return f" of a world of {world}" if world is not None else ""


def uniform_group_size(pg_config: Sequence[dict]) -> int | None:
    """The group size every listed process group shares, or None (none listed, or several)."""
    sizes = {g.get("pg_size") for g in pg_config}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size if type(size) is int and size > 0 else None


def choose_rank(
    path: Path, meta_rank: int | None, rank: int | None, warnings: list[str]
) -> tuple[int, str]:
    from_name = _as_int(rank_from_filename(path.name), 0, _RANK_LIMIT)
    if rank is not None and _as_int(rank, 0, _RANK_LIMIT) is None:
        raise TracekitError(f"rank {rank!r} is not a rank (0 <= rank < 2**31)", path)
    if meta_rank is not None:
        if from_name is not None and from_name != meta_rank:
            warnings.append(
                f"file name says rank {from_name} but distributedInfo says "
                f"{meta_rank}; using {meta_rank}"
            )
        return meta_rank, "distributedInfo"
    if rank is not None:
        return rank, "argument"
    if from_name is not None:
        return from_name, "filename"
    warnings.append(NO_RANK_WARNING)
    return 0, "default"


#: c10::DeviceType numbers of the [memory] events' "Device Type" -> torch device names
_DEVICE_TYPES = {
    0: "cpu",
    1: "cuda",
    2: "mkldnn",
    3: "opengl",
    4: "opencl",
    5: "ideep",
    6: "hip",
    7: "fpga",
    8: "maia",
    9: "xla",
    10: "vulkan",
    11: "metal",
    12: "xpu",
    13: "mps",
    14: "meta",
    15: "hpu",
    16: "ve",
    17: "lazy",
    18: "ipu",
    19: "mtia",
    20: "privateuseone",
}


def memory_peaks(raws: Sequence[RawArgs], path: Path) -> dict[str, int]:
    """Device -> max ``Total Allocated`` over the ``[memory]`` instant events (``ph: "i"``).

    Keys are torch device names: "cpu", "cuda:0", ... On CPU the profiler's reporter counts only
    tensors allocated while it records, so the CPU peak is the peak of memory allocated during
    the profiled window (tensors that existed before it are not in it); on GPU it is the caching
    allocator's total allocated, everything included.
    """
    mem = [full_args(r, path) for r in raws]
    if not mem:
        return {}
    frame = pl.DataFrame(
        [
            series("type", [a.device_type for a in mem], pl.Int64),
            series("id", [a.device_id for a in mem], pl.Int64),
            series("total", [a.total_allocated for a in mem], pl.Int64),
        ]
    ).drop_nulls()
    name = pl.col("type").replace_strict(_DEVICE_TYPES, default=None, return_dtype=pl.Utf8)
    name = pl.coalesce(name, pl.lit("device") + pl.col("type").cast(pl.Utf8))
    peaks = (
        frame.group_by("type", "id")
        .agg(pl.col("total").max())
        .with_columns(
            pl.when((pl.col("type") == 0) | (pl.col("id") < 0))
            .then(name)
            .otherwise(pl.concat_str([name, pl.col("id").cast(pl.Utf8)], separator=":"))
            .alias("device")
        )
    )
    return {d: int(t) for d, t in peaks.select("device", "total").iter_rows()}


def count_steps(frame: pl.DataFrame) -> int:
    steps = frame.filter(pl.col("name").str.starts_with("ProfilerStep#")).filter(
        (pl.col("device") == "cpu") & pl.col("name").str.contains(r"^ProfilerStep#\d+$")
    )
    return steps["name"].n_unique()


# --- read from the head of the file, without parsing it ------------------------------------


_DIST_KEY = b'"distributedInfo"'


def _object_at(text: bytes, start: int) -> bytes | None:
    """The JSON object that starts at ``text[start]`` (a "{"), or None if it is cut off."""
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:  # backslash
                esc = True
            elif c == 0x22:  # quote
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c == 0x7B:  # {
            depth += 1
        elif c == 0x7D:  # }
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def peek_distributed_info(path: Path, head_bytes: int = HEAD_BYTES) -> dict | None:
    """``distributedInfo`` read from the first 64 KB of a trace, without parsing its events.

    Kineto writes it before ``traceEvents``, so selecting ranks by it (``--ranks``,
    ``--sample``) costs a few milliseconds per file, not a parse. None when the head does not
    hold it (or the file cannot be read: reading it later reports that properly).
    """
    head = read_head(path, head_bytes)
    if head is None:
        return None
    at = head.find(_DIST_KEY)
    if at < 0:
        return None
    brace = head.find(b"{", at + len(_DIST_KEY))
    if brace < 0 or head[at + len(_DIST_KEY) : brace].strip(b" \t\r\n:") != b"":
        return None
    obj = _object_at(head, brace)
    try:
        info = msgspec.json.decode(obj) if obj else None
    except msgspec.DecodeError:
        return None
    return info if isinstance(info, dict) else None


def peek_rank(path: Path) -> int | None:
    """The rank a trace file declares in its head (``distributedInfo.rank``), else None."""
    info = peek_distributed_info(path)
    return _as_int(info.get("rank"), 0, _RANK_LIMIT) if info else None
