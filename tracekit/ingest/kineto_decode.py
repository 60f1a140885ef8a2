"""Decoding a trace's JSON: two paths, one result (:class:`Decoded`: the X events' raw columns).

Parse speed is a product feature (HTA needs ~0.8 CPU-s per 10 MB rank), so the bytes
(tracekit.ingest.kineto_files) are read by one of two paths that give the same result:

- the C scanner (``_kscan.c``, built at install): one pass over the bytes straight into Arrow
  columns that polars takes over without copying, texts interned once each, no Python object
  per event, the GIL released (ranks scan in parallel threads); each event's ``args`` is kept
  as a byte range and only four keys are read from it. It declines anything it is not certain
  to read exactly like the msgspec path (tests/test_scanner.py holds it to that);
- msgspec (the fallback, and the judge of what a bad file is): typed Structs that declare only
  the fields used, ``args`` raw, one list comprehension per column.

Only the few rows that are collective calls, thread names or memory events decode their full
args (:class:`FullArgs`). What the columns become: tracekit.ingest.kineto_classify.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from tracekit import stopping
from tracekit.errors import TracekitError
from tracekit.events import DType
from tracekit.ingest import read_ahead

try:
    from tracekit.ingest import _kscan
except ImportError:  # built without a C compiler: the msgspec path reads everything
    _kscan = None  # type: ignore[assignment]


JsonBytes = bytes | bytearray  # a trace's JSON (bytearray: gunzipped)
RawArgs = bytes | bytearray | msgspec.Raw  # one event's args JSON, as either decoding path keeps it

_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` keys ingest reads on the rows that need more than :class:`_Common`
    (collective calls, thread names, memory events); loose types because real traces vary."""

    name: Any = None  # thread_name metadata
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")  # [memory] events
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class _Common(msgspec.Struct, gc=False):
    """The ``args`` keys every X event may need (the rest are read from the few rows that use
    them: collective calls, thread names, memory events)."""

    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    coll_name: Any = msgspec.field(default=None, name="Collective name")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    # kept as raw JSON and decoded per use: a typed decode of every event's args was a third of
    # the decode time and most of its objects (measured: 195 -> 105 ms for a 30 MB trace)
    args: msgspec.Raw = _NO_RAW


class Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]  # noqa: N815 - the file's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    host_name: Any = None


def _decode(data: JsonBytes, path: Path) -> Trace:
    """Typed decode; on failure retry via the stdlib (NaN, Infinity, 1e400) before giving up."""
    decoder = msgspec.json.Decoder(Trace, strict=False)
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        first = exc
    try:  # json.loads accepts NaN/Infinity; msgspec re-encodes them as null ("missing")
        return decoder.decode(msgspec.json.encode(json.loads(data)))
    except Exception:  # noqa: BLE001 - any failure here means the first error stands
        pass
    if isinstance(first, RecursionError):
        raise TracekitError("not a Kineto trace (JSON nested too deeply)", path) from None
    if isinstance(first, msgspec.ValidationError):
        raise TracekitError(f"not a Kineto trace ({first})", path) from None
    raise TracekitError(f"not valid JSON ({first})", path) from None


# --- args, decoded where used ---------------------------------------------------------------


_NO_COMMON, _NO_ARGS = _Common(), _Args()
_COMMON_DECODER = msgspec.json.Decoder(_Common, strict=False)
_ARGS_DECODER = msgspec.json.Decoder(_Args, strict=False)


def _args_of(decoder: msgspec.json.Decoder, raw: RawArgs, path: Path, empty: Any) -> Any:
    """One event's args (absent or null: ``empty``); anything else that is not an object is an
    error naming the file, as a typed decode of the whole file would have said."""
    if not raw:
        return empty
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        if bytes(raw).strip() == b"null":
            return empty
        raise TracekitError(f"not a Kineto trace (an event's args: {exc})", path) from None
    except msgspec.DecodeError as exc:
        try:  # NaN / Infinity / 1e400, which json.loads reads
            return decoder.decode(msgspec.json.encode(json.loads(bytes(raw))))
        except Exception:  # noqa: BLE001 - the first error stands
            raise TracekitError(f"not valid JSON ({exc})", path) from None
    except RecursionError:
        raise TracekitError("not a Kineto trace (JSON nested too deeply)", path) from None


def _common_args(xs: list[_Event], path: Path) -> list[_Common]:
    """``_Common`` of every X event: one decode call each, the careful path only if one fails."""
    decode = _COMMON_DECODER.decode
    try:
        return [decode(e.args) if e.args else _NO_COMMON for e in xs]
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return [_args_of(_COMMON_DECODER, e.args, path, _NO_COMMON) for e in xs]


def full_args(raw: RawArgs, path: Path) -> _Args:
    return _args_of(_ARGS_DECODER, raw, path, _NO_ARGS)


class FullArgs:
    """All read ``args`` keys of X event i (``_Args``), decoded on first use."""

    def __init__(self, raw_args: Callable[[int], RawArgs], path: Path) -> None:
        self.raw_args, self.path = raw_args, path
        self.done: dict[int, _Args] = {}

    def __getitem__(self, i: int) -> _Args:
        if i not in self.done:
            self.done[i] = full_args(self.raw_args(i), self.path)
        return self.done[i]


# --- columns --------------------------------------------------------------------------------


def _keep(values: list, dtype: DType) -> list:
    """Only the values a column of ``dtype`` can hold (bools, lists, dicts become None)."""
    if dtype == pl.Utf8:
        return [v if v.__class__ is str else None for v in values]
    if dtype == pl.Float64:
        return [v if v.__class__ is float or v.__class__ is int else None for v in values]
    return [v if v.__class__ is int else None for v in values]


def series(name: str, values: list, dtype: DType) -> pl.Series:
    """A typed column from loosely typed values; what does not fit becomes null.

    The strict constructor is the fast path for well-formed traces; anything odd (text where
    a number belongs, nested lists, ints beyond 64 bits) takes the filtered path.
    """
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except Exception:  # noqa: BLE001 - polars raises several types here; the fallback is total
        return pl.Series(name, _keep(values, dtype), dtype=dtype, strict=False)


def _text_series(name: str, values: list) -> pl.Series:
    """pid/tid as text: all-int ids are converted by polars (the usual case, 2x faster than
    per-value Python); mixed ones (``"Spans"``) take few distinct values, each converted once."""
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True).cast(pl.Utf8)
    except Exception:  # noqa: BLE001 - text, floats, huge or odd values: the general path
        pass
    try:
        text = {v: v if v.__class__ is str else None if v is None else str(v) for v in set(values)}
        return pl.Series(name, [text[v] for v in values], dtype=pl.Utf8)
    except (TypeError, KeyError):  # unhashable (a list where an id belongs) or NaN
        kept = [v if v.__class__ in (str, int, float) else None for v in values]
        return pl.Series(
            name, [v if v is None or v.__class__ is str else str(v) for v in kept], dtype=pl.Utf8
        )


def _base_frame(xs: list[_Event], args: list[_Common]) -> pl.DataFrame:
    """Raw columns of the X events, one comprehension each, in file order (column ``i``)."""
    return pl.DataFrame(
        [
            pl.Series("i", range(len(xs)), dtype=pl.Int64),
            series("cat", [e.cat for e in xs], pl.Utf8),
            series("name", [e.name for e in xs], pl.Utf8),
            _text_series("pid", [e.pid for e in xs]),
            _text_series("tid", [e.tid for e in xs]),
            series("ts", [e.ts for e in xs], pl.Float64),
            series("dur", [e.dur for e in xs], pl.Float64),
            series("stream_arg", [a.stream for a in args], pl.Int64),
            series("correlation", [a.correlation for a in args], pl.Int64),
            series("external_id", [a.external_id for a in args], pl.Int64),
            series("coll_name", [a.coll_name for a in args], pl.Utf8),
        ]
    )


# --- the decoded trace: two paths, one result ----------------------------------------------


@dataclass
class Decoded:
    """One trace as the rest of ingest reads it, from either decoding path."""

    top: Trace  # distributedInfo, deviceProperties, ... (no events)
    xframe: pl.DataFrame  # the X events' raw columns (_base_frame's), file order
    raw_args: Callable[[int], RawArgs]  # X event i -> its args JSON (b"" when none)
    threads: pl.DataFrame  # pid, tid (text) of thread_name metadata events
    thread_args: Sequence[RawArgs]  # ... and their args
    memory_args: Sequence[RawArgs]  # args of the [memory] instant events


def _decoded_msgspec(data: JsonBytes, path: Path) -> Decoded:
    """The general path: msgspec Structs, then one comprehension per column. Reads every
    trace, and words every error."""
    trace = _decode(data, path)
    events = trace.traceEvents
    xs = [e for e in events if e.ph == "X"]
    meta = [e for e in events if e.ph == "M" and e.name == "thread_name" and e.args]
    threads = pl.DataFrame(
        [_text_series("pid", [e.pid for e in meta]), _text_series("tid", [e.tid for e in meta])]
    )
    memory = [e.args for e in events if e.ph == "i" and e.name == "[memory]" and e.args]
    trace.traceEvents = []  # the frames hold what is needed; free the Structs early
    return Decoded(
        trace,
        _base_frame(xs, _common_args(xs, path)),
        lambda i: xs[i].args,
        threads,
        [e.args for e in meta],
        memory,
    )


class _ArrowColumns:
    """The scanner's (arrow_schema, arrow_array) capsules, in the form polars imports."""

    def __init__(self, capsules: tuple) -> None:
        self.capsules = capsules

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple:
        return self.capsules


def _decoded_fast(data: JsonBytes, path: Path) -> Decoded | None:
    """The C scanner's path (tracekit/ingest/_kscan.c): columns without per-event Python
    objects. None when the scanner is not built or declines the file (anything unusual:
    the msgspec path then reads it, or says what is wrong). The scan stops when its scope is
    stopped (tracekit.stopping: Stopped), and in the main thread on Ctrl-C."""
    if _kscan is None:
        return None
    scanned = read_ahead.take_scan(data) or _kscan.scan(data, stopping.flag())
    if scanned is None:
        stopping.check()  # it stopped because it was asked to, rather than declined
        return None
    _, strings, capsules, spans = scanned
    try:
        top = Trace([], **{k: msgspec.json.decode(data[a:b]) for k, (a, b) in spans.items()})
    except (msgspec.DecodeError, RecursionError):
        return None
    text = pl.Series("text", strings, dtype=pl.Utf8)

    def codes(column: str, *values: str) -> pl.Expr:  # several codes may spell one text
        return pl.col(column).is_in([k for k, t in enumerate(strings) if t in values])

    def texts(*columns: str) -> list[pl.Expr]:
        return [pl.lit(text).gather(pl.col(c)).alias(c) for c in columns]

    events = pl.DataFrame(_ArrowColumns(capsules))
    xs = events.filter(codes("ph", "X"))
    xframe = xs.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("i"),
        *texts("cat", "name", "pid", "tid"),
        "ts",
        "dur",
        "stream_arg",
        "correlation",
        "external_id",
        *texts("coll_name"),
    )
    spans_of_args = xs.select("args_start", "args_end")  # looked up for the few rows that need them
    with_args = pl.col("args_end") > pl.col("args_start")
    meta = events.filter(codes("ph", "M") & codes("name", "thread_name") & with_args)
    memory = events.filter(codes("ph", "i") & codes("name", "[memory]") & with_args)
    return Decoded(
        top,
        xframe,
        lambda i: data[slice(*spans_of_args.row(i))],
        meta.select(texts("pid", "tid")),
        [data[a:b] for a, b in meta.select("args_start", "args_end").iter_rows()],
        [data[a:b] for a, b in memory.select("args_start", "args_end").iter_rows()],
    )


def decode_trace(data: JsonBytes, path: Path) -> Decoded:
    return _decoded_fast(data, path) or _decoded_msgspec(data, path)
