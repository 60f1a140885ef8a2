"""PyTorch flight-recorder dumps (JSON) -> one row per recorded collective.

The flight recorder keeps the last ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (2000) collectives of every
process group, for NCCL and gloo alike. ``torch._C._distributed_c10d._dump_fr_trace_json()``
returns them as JSON (torch 2.13: format ``"version": "2.10"``)::

    {"version": "2.10", "comm_lib_version": "", "nccl_comm_state": {},
     "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
     "pg_status": {"0": {"last_enqueued_collective": "6", "last_started_collective": "-1",
                         "last_completed_collective": "6"}},
     "entries": [{"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"],
                  "collective_seq_id": 1, "p2p_seq_id": 0, "op_id": 1, "is_p2p": false,
                  "profiling_name": "gloo:all_reduce", "input_sizes": [[8]],
                  "input_dtypes": ["Float"], "output_sizes": [[8]], "output_dtypes": ["Float"],
                  "state": "scheduled", "time_created_ns": 1795992844678360359,
                  "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0,
                  "retired": true, "timeout_ms": 1800000, "thread_id": "1403..",
                  "thread_name": "python"}]}

What a real gloo dump (torch 2.13, CPU) holds and lacks:

* no rank anywhere in the file: it comes from the caller or the file name (``fr_rank3.json``,
  ``nccl_trace_rank_3``); no ``duration_ms`` and no started/completed times (always 0, state
  always ``scheduled``): those are filled only by NCCL's watchdog (``duration_ms`` only with
  ``TORCH_NCCL_ENABLE_TIMING``). 0 is read as "unknown" (null).
* ``pg_config`` is a placeholder (``{"": {"ranks": "[]"}}``): gloo never registers group
  ranks. NCCL dumps fill it, ``ranks`` being a *string* such as ``"[0, 1]"``.
  ``read_flight_records`` then fills a group's ranks from which dumps contain its entries.
* ``process_group`` is ``[name, desc]``: ``["0", "default_pg"]``, ``["1", "undefined"]`` for a
  ``new_group`` without ``group_desc``; ``collective_seq_id`` counts per group from 1.
* send/recv (``dist.send``, ``isend``, ``batch_isend_irecv``) leave *no entry* on gloo; they only
  consume an ``op_id`` (the next entry's ``op_id`` skips one).
* gloo has no native reduce-scatter: ``reduce_scatter_tensor`` is recorded as
  ``gloo:all_reduce`` with the full input as both input and output size, and the list form
  ``reduce_scatter`` as one ``gloo:all_reduce`` *per rank* on chunk-sized tensors, each with its own
  ``collective_seq_id``. Neither is distinguishable from a real all_reduce in the dump.
* ``entries`` is left out when there are none; ``gather``/``scatter`` have empty output/input
  sizes on non-root ranks.

Pickled dumps (the default file format of the NCCL watchdog) are never loaded: unpickling a file
someone handed you runs arbitrary code. Such files are refused with a TracekitError.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit import guarded_read, runfolder
from tracekit.errors import TracekitError
from tracekit.events import DType
from tracekit.ingest.kineto_files import max_trace_bytes

NOT_JSON = "flight-recorder dump is not JSON (pickled dumps are never loaded)"

# Bytes per element, by c10::toString(ScalarType) as written in input_dtypes/output_dtypes.
DTYPE_BYTES = {
    "Bool": 1,
    "Byte": 1,
    "Char": 1,
    "QInt8": 1,
    "QUInt8": 1,
    "QUInt4x2": 1,
    "QUInt2x4": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1,
    "Float4_e2m1fn_x2": 1,
    "Bits8": 1,
    "Bits1x8": 1,
    "Bits2x4": 1,
    "Bits4x2": 1,
    "UInt8": 1,
    "Int8": 1,
    "Short": 2,
    "Half": 2,
    "BFloat16": 2,
    "UInt16": 2,
    "Bits16": 2,
    "Int": 4,
    "Float": 4,
    "QInt32": 4,
    "UInt32": 4,
    "ComplexHalf": 4,
    "Long": 8,
    "Double": 8,
    "UInt64": 8,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}

# profiling_name after "backend:" -> op name (docs/labels.md).
_OP_NAMES = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allreduce_sparse": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather",
    "all_gather_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "broadcast_coalesced": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "barrier": "barrier",
}

S, I, F, B = pl.Utf8, pl.Int64, pl.Float64, pl.Boolean
ENTRY_SCHEMA: dict[str, DType] = {
    "rank": I,
    "pg_id": I,
    "pg_name": S,
    "pg_desc": S,
    "collective_seq_id": I,
    "p2p_seq_id": I,
    "is_p2p": B,
    "op": S,
    "profiling_name": S,
    "in_bytes": I,
    "out_bytes": I,
    "dtype": S,
    "state": S,
    "time_created_ns": I,
    "started_ns": I,
    "completed_ns": I,
    "duration_ms": F,
    "record_id": I,
    "op_id": I,
    "input_sizes": pl.List(pl.List(I)),
    "output_sizes": pl.List(pl.List(I)),
    "retired": B,
    "timeout_ms": I,
    "thread_name": S,
}
GROUP_SCHEMA: dict[str, DType] = {
    "pg_name": S,
    "pg_desc": S,
    "pg_id": I,
    "ranks": pl.List(I),
    "ranks_source": S,
}


class _Entry(msgspec.Struct):
    """One ring-buffer entry; every field optional so older/newer dumps still decode."""

    record_id: int | None = None
    pg_id: int | str | None = None
    process_group: list[str] | None = None
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op_id: int | None = None
    profiling_name: str | None = None
    time_created_ns: int | None = None
    duration_ms: float | None = None
    input_sizes: list[list[int]] | None = None
    input_dtypes: list[str] | None = None
    output_sizes: list[list[int]] | None = None
    output_dtypes: list[str] | None = None
    state: str | None = None
    time_discovered_started_ns: int | None = None
    time_discovered_completed_ns: int | None = None
    retired: bool | None = None
    timeout_ms: int | None = None
    is_p2p: bool | None = None
    thread_name: str | None = None


class _Dump(msgspec.Struct):
    version: str | int | float | None = None
    rank: int | str | None = None
    comm_lib_version: str | None = None
    pg_config: dict[str, Any] | None = None
    pg_status: dict[str, Any] | None = None
    entries: list[Any] | None = None


class _TypedDump(_Dump):
    """Fast path: entries decoded straight into structs (falls back to _Dump when one is odd)."""

    entries: list[_Entry] | None = None


@dataclass(frozen=True)
class FlightRecord:
    """One rank's flight-recorder dump as tables (see the module docstring)."""

    path: Path
    rank: int | None
    version: str | None
    entries: pl.DataFrame
    groups: pl.DataFrame
    warnings: tuple[str, ...] = ()


# -- decoding -----------------------------------------------------------------------------------
def _read_bytes(path: Path) -> bytes:
    """The dump's bytes through the guarded reader: a FIFO, a link to /dev/zero or a dump over
    the trace size limit is one line, never a hang or MemoryError."""
    limit, _ = max_trace_bytes()
    try:
        return guarded_read.read_limited(path, limit)
    except TracekitError as exc:
        raise TracekitError(f"flight-recorder dump not read: {exc.problem}", path) from None


def _decode(path: Path, data: bytes) -> _Dump:
    """The dump's top level; a clear TracekitError for empty, pickled, damaged or foreign files."""
    head = data.lstrip()[:1]
    if not head:
        raise TracekitError("flight-recorder dump is empty", path)
    if head not in (b"{", b"["):
        raise TracekitError(NOT_JSON, path)
    guarded_read.check_depth(data, path)  # msgspec recurses once per level
    try:
        try:
            dump: _Dump = msgspec.json.decode(data, type=_TypedDump)
        except msgspec.ValidationError:
            dump = msgspec.json.decode(data, type=_Dump)
    except msgspec.ValidationError as exc:
        raise TracekitError(f"not a flight-recorder dump ({exc})", path) from None
    except msgspec.DecodeError as exc:
        raise TracekitError(
            f"flight-recorder dump is damaged or truncated JSON ({exc})", path
        ) from None
    if dump.entries is None and dump.pg_config is None and dump.version is None:
        raise TracekitError("not a flight-recorder dump (no version, pg_config or entries)", path)
    return dump


def _entries(raw: list[Any]) -> tuple[list[_Entry], int]:
    """Entries as structs; after a failed fast path, converted one by one (lax), so one odd
    entry does not lose the file."""
    if all(isinstance(item, _Entry) for item in raw):
        return raw, 0
    out, bad = [], 0
    for item in raw:
        try:
            out.append(msgspec.convert(item, _Entry, strict=False))
        except msgspec.ValidationError:
            bad += 1
    return out, bad


# -- rows ---------------------------------------------------------------------------------------
def op_name(profiling_name: str | None) -> str | None:
    """``"nccl:_reduce_scatter_base"`` -> ``"reduce_scatter"``; None for gather/scatter/unknown."""
    if not profiling_name:
        return None
    name = profiling_name.split(":", 1)[-1].strip()
    name = name.split(" ", 1)[0]  # "nccl:send 0->1"
    return _OP_NAMES.get(name)


def tensor_bytes(sizes: list[list[int]] | None, dtypes: list[str] | None) -> int | None:
    """Sum over tensors of prod(shape) x element size; None when a dtype is unknown."""
    if not sizes:
        return 0 if sizes is not None else None
    dtypes = dtypes or []
    total = 0
    for i, shape in enumerate(sizes):
        dtype = dtypes[i] if i < len(dtypes) else (dtypes[-1] if dtypes else None)
        size = DTYPE_BYTES.get(dtype) if dtype else None
        if size is None:
            return None
        total += math.prod(shape) * size
    return _i64(total)


_I64 = 2**63


def _time(value: int | None) -> int | None:
    return _i64(value) if value else None


def _int(value: Any) -> int | None:
    try:
        return _i64(int(value))
    except (TypeError, ValueError, OverflowError):
        return None


def _i64(value: int | None) -> int | None:
    """VALUE when it fits an Int64 column, else None (only a damaged dump has such numbers)."""
    return value if value is None or -_I64 <= value < _I64 else None


def _sizes(sizes: list[list[int]] | None) -> list[list[int]] | None:
    if sizes is None or all(-_I64 <= d < _I64 for shape in sizes for d in shape):
        return sizes
    return None


def _row(e: _Entry, rank: int | None) -> dict[str, Any]:
    pg = e.process_group or []
    dtypes = e.input_dtypes or e.output_dtypes or []
    ins, outs = _sizes(e.input_sizes), _sizes(e.output_sizes)
    return {
        "rank": rank,
        "pg_id": _int(e.pg_id),
        "pg_name": pg[0] if pg else None,
        "pg_desc": pg[1] if len(pg) > 1 else None,
        "collective_seq_id": _i64(e.collective_seq_id),
        "p2p_seq_id": _i64(e.p2p_seq_id),
        "is_p2p": e.is_p2p,
        "op": op_name(e.profiling_name),
        "profiling_name": e.profiling_name,
        "in_bytes": tensor_bytes(ins, e.input_dtypes),
        "out_bytes": tensor_bytes(outs, e.output_dtypes),
        "dtype": dtypes[0] if dtypes else None,
        "state": e.state,
        "time_created_ns": _time(e.time_created_ns),
        "started_ns": _time(e.time_discovered_started_ns),
        "completed_ns": _time(e.time_discovered_completed_ns),
        "duration_ms": e.duration_ms,
        "record_id": _i64(e.record_id),
        "op_id": _i64(e.op_id),
        "input_sizes": ins,
        "output_sizes": outs,
        "retired": e.retired,
        "timeout_ms": _i64(e.timeout_ms),
        "thread_name": e.thread_name,
    }


def _parse_ranks(value: Any) -> list[int] | None:
    """``[0, 1]`` or NCCL's string ``"[0, 1]"`` -> [0, 1]."""
    if isinstance(value, str):
        value = re.findall(r"-?\d+", value)
    if not isinstance(value, list):
        return None
    ranks = [_int(x) for x in value]
    return [r for r in ranks if r is not None]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _groups(pg_config: dict[str, Any] | None, entries: pl.DataFrame) -> pl.DataFrame:
    """Groups seen in pg_config (real ranks) or in the entries (ranks unknown here)."""
    rows: dict[str, dict[str, Any]] = {}
    for key, info in (pg_config or {}).items():
        info = info if isinstance(info, dict) else {}
        name = str(info.get("name", key) or key)
        ranks = _parse_ranks(info.get("ranks"))
        if not name and not ranks:  # gloo's placeholder {"": {"ranks": "[]"}}
            continue
        rows[name] = {
            "pg_name": name,
            "pg_desc": _text(info.get("desc")),
            "pg_id": None,
            "ranks": ranks or None,
            "ranks_source": "pg_config" if ranks else None,
        }
    seen = entries.select("pg_name", "pg_desc", "pg_id").unique(maintain_order=True)
    for name, desc, pg_id in seen.iter_rows():
        if name is None:
            continue
        row = rows.setdefault(
            name,
            {"pg_name": name, "pg_desc": desc, "pg_id": None, "ranks": None, "ranks_source": None},
        )
        row["pg_id"] = pg_id if row["pg_id"] is None else row["pg_id"]
        row["pg_desc"] = row["pg_desc"] or desc
    return pl.DataFrame(list(rows.values()), schema=GROUP_SCHEMA)


# -- public API ---------------------------------------------------------------------------------
def read_flight_record(path: Path, rank: int | None = None) -> FlightRecord:
    """One JSON dump. Rank: the dump's own ``rank`` if any, else RANK, else from the file name
    (``fr_rank<R>.json``, ``rank<R>``, ``nccl_trace_rank_<R>``), else None with a warning."""
    path = Path(path)
    dump = _decode(path, _read_bytes(path))
    warnings: list[str] = []
    if _int(dump.rank) is not None:
        rank = _int(dump.rank)
    elif rank is None:
        rank = runfolder.rank_from_filename(path.name)
        if rank is None:
            warnings.append(f"{path.name}: no rank in the dump or its name")
    entries, bad = _entries(dump.entries or [])
    if bad:
        warnings.append(f"{path.name}: {bad} entries could not be read and were skipped")
    frame = pl.DataFrame([_row(e, rank) for e in entries], schema=ENTRY_SCHEMA)
    unknown = frame.filter(pl.col("in_bytes").is_null() & pl.col("input_sizes").list.len().gt(0))
    if unknown.height:
        warnings.append(
            f"{path.name}: {unknown.height} entries have a dtype of unknown size: bytes null"
        )
    version = None if dump.version is None else str(dump.version)
    return FlightRecord(
        path=path,
        rank=rank,
        version=version,
        entries=frame,
        groups=_groups(dump.pg_config, frame),
        warnings=tuple(warnings),
    )


def _dump_files(paths_or_dir: Path | Sequence[Path]) -> list[Path]:
    items = (
        [Path(paths_or_dir)]
        if isinstance(paths_or_dir, (str, Path))
        else [Path(p) for p in paths_or_dir]
    )
    files: list[Path] = []
    for item in items:
        if not item.exists():
            raise TracekitError("no such file or folder", item)
        if item.is_dir():
            root = runfolder.nccl_dir(item) if runfolder.is_run_folder(item) else item
            files.extend(p for p in sorted(root.glob("*.json")) if not p.name.startswith("."))
        else:
            files.append(item)
    if not files:
        raise TracekitError("no flight-recorder dumps (*.json) here", items[0] if items else ".")
    return files


def _fill_group_ranks(records: list[FlightRecord]) -> list[FlightRecord]:
    """Groups without pg_config ranks get the ranks whose dumps hold entries of that group."""
    members: dict[str, set[int]] = {}
    for rec in records:
        if rec.rank is None:
            continue
        for name in rec.entries["pg_name"].drop_nulls().unique():
            members.setdefault(name, set()).add(rec.rank)
    out = []
    for rec in records:
        g = rec.groups
        inferred = pl.Series(
            "inferred",
            [sorted(members.get(n, ())) or None for n in g["pg_name"]],
            dtype=pl.List(pl.Int64),
        )
        missing = g["ranks"].is_null()
        g = g.with_columns(
            ranks=pl.when(missing).then(inferred).otherwise(pl.col("ranks")),
            ranks_source=pl.when(missing & inferred.is_not_null())
            .then(pl.lit("entries"))
            .otherwise(pl.col("ranks_source")),
        )
        out.append(dataclasses.replace(rec, groups=g))
    return out


def read_flight_records(paths_or_dir: Path | Sequence[Path]) -> list[FlightRecord]:
    """Every ``*.json`` dump in a folder (a run folder: its nccl/) or the files given, by rank.

    A group's ``ranks`` come from pg_config when the dump has them (NCCL), else from which
    dumps hold entries of that group (``ranks_source="entries"``: a member rank whose buffer
    holds no entry of the group is missed).
    """
    records = [read_flight_record(p) for p in _dump_files(paths_or_dir)]
    records.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, str(r.path)))
    return _fill_group_ranks(records)
