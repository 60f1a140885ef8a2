"""The C scanner (tracekit/ingest/_kscan.c) against the msgspec path it speeds up.

The scanner is a fast path, never the judge: on every input it must either give exactly what
the msgspec path gives (same TraceInfo, same events frame) or decline (None), and it must
never accept a file the msgspec path refuses. Real traces must take the fast path.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from builders.corpus_root import HTA_TRACES
from builders.damage import SEEDS, damaged
from conftest import HTA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tracekit.errors import TracekitError
from tracekit.ingest import kineto, kineto_decode, kineto_files

ROOT = Path(__file__).resolve().parents[1]
REAL = sorted(
    p
    for p in [
        *(ROOT / "sample_traces").rglob("rank*.json*"),
        *(ROOT / "tests" / "data").rglob("*.json*"),
    ]
    if p.is_file() and b"traceEvents" in kineto_files.read_bytes(p)[: 1 << 20]
) + [pytest.param(HTA / t, marks=pytest.mark.corpus) for t in HTA_TRACES]


def both(data: bytes, path: Path, rank: int | None = None) -> tuple:
    """(fast result or None, msgspec result or the TracekitError it raised)."""
    try:
        slow = kineto._read_decoded(kineto_decode._decoded_msgspec(data, path), path, rank)
    except TracekitError as err:
        slow = err
    fast = kineto_decode._decoded_fast(data, path)
    if fast is not None:
        try:
            fast = kineto._read_decoded(fast, path, rank)
        except TracekitError as err:
            fast = err
    return fast, slow


def assert_same(fast: tuple | TracekitError, slow: tuple | TracekitError) -> None:
    if isinstance(slow, TracekitError):
        assert isinstance(fast, TracekitError) and str(fast) == str(slow)
        return
    assert not isinstance(fast, TracekitError), fast
    assert fast[0] == slow[0]
    assert_frame_equal(fast[1], slow[1])


def test_scanner_is_built() -> None:
    """setup.py builds it (optional, so a machine without a compiler still installs): CI
    machines have one, and a silent fallback would hide a 3x slowdown."""
    assert kineto_decode._kscan is not None


@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_real_traces_take_the_fast_path_and_match(path: Path) -> None:
    data = kineto_files.read_bytes(path)
    fast, slow = both(data, path)
    assert fast is not None, "the scanner declined a real trace"
    assert_same(fast, slow)


def event(**fields: object) -> dict:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 2,
        "ts": 10.5,
        "dur": 3.25,
        "args": {"External id": 7},
        **fields,
    }


def trace_bytes(*events: dict, **top: object) -> bytes:
    return json.dumps({"traceEvents": list(events), **top}).encode()


# inputs the scanner must read exactly like the msgspec path
SAME = {
    "escapes and unicode": trace_bytes(
        event(name='a"b\\c\n\u00e9\u4e2d\U0001f600'),
        event(name="\u00e9\u4e2d"),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "t\u00e9 (x)"}},
    ),
    "escaped text spelled two ways": (
        b'{"traceEvents": [{"ph": "X", "name": "ab", "ts": 1, "dur": 1},'
        b'{"ph": "\\u0058", "name": "\\u0061b", "ts": 2, "dur": 1}]}'
    ),
    "mixed pid types": trace_bytes(
        event(pid="Spans", tid="PyTorch Profiler"),
        event(pid=-3, tid=0),
        event(pid=None, tid=12345678901234567890),
    ),
    "numbers": trace_bytes(
        event(ts=0, dur=0),
        event(ts=-0.0, dur=1e-3),
        event(ts=1.5e3, dur=2e2),
        event(ts=1695835535123456, dur=7),
        event(ts=0.1234567890123456789, dur=1),
        event(ts=9007199254740992, dur=1),
        event(ts=123456.78901234, dur=0.001),
    ),
    "odd types become null": trace_bytes(
        event(ts="12", dur=[1]),
        event(cat=5, name={"a": 1}),
        event(args={"stream": "0x0", "correlation": 1.5, "External id": [1]}),
        event(args={"Collective name": 3}),
        event(ph=None),
        event(args=None),
        event(ph=7),
    ),
    "rows not read, with numbers parsed late": (
        b'{"traceEvents": [{"ph": "f", "ts": 0.12345678901234567890123, "dur": 1e300},'
        b'{"ph": "X", "name": "a", "ts": 5, "dur": 1}, {"ph": "s", "ts": 1e-400},'
        b'{"ph": "X", "name": "b", "ts": 0.98765432109876543210, "dur": 2}]}'
    ),
    "a late number in a column that grows after it": trace_bytes(
        event(ts=0.12345678901234567890123, dur=1.00000000000000000000001),
        *[event(ts=float(k), dur=1.0) for k in range(9000)],
    ),
    "missing fields": trace_bytes({"ph": "X"}, {"name": "x", "ts": 1, "dur": 1}, {}),
    "no X events": trace_bytes({"ph": "M", "name": "process_name", "args": {"name": "p"}}),
    "empty": b'{"traceEvents": []}',
    "top-level fields": trace_bytes(
        event(),
        distributedInfo={"rank": 3, "backend": "gloo", "pg_config": [{"pg_size": 2}]},
        baseTimeNanoseconds=1700000000000000000,
        host_name="h1",
        deviceProperties=[{"id": 0}],
        other={"x": [1, 2, {"y": None}]},
    ),
    "memory events": trace_bytes(
        event(),
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 1,
            "args": {"Total Allocated": 100, "Device Type": 1, "Device Id": 0},
        },
    ),
    "whitespace": b' \n{ "traceEvents" :\t[ { "ph" : "X" , "ts" : 1 , "dur" : 2 } ] }\r\n',
    "collective call args": trace_bytes(
        event(args={"stream": 1, "Input Dims": "x"}),
        event(name="c10d::allreduce_", args={"Input Dims": [[4]]}),
    ),
}

# inputs the scanner leaves to the msgspec path (which may read them or refuse them)
DECLINED = {
    "duplicate key": b'{"traceEvents": [{"ph": "X", "ts": 1, "ts": 2, "dur": 1}]}',
    "escaped key": b'{"traceEvents": [{"\\u0070h": "X", "ts": 1, "dur": 1}]}',
    "bool time": trace_bytes(event(ts=True)),
    "bool id arg": trace_bytes(event(args={"correlation": False})),
    "float pid": trace_bytes(event(pid=1.5)),
    "minus zero pid": b'{"traceEvents": [{"ph": "X", "pid": -0, "ts": 1, "dur": 1}]}',
    "huge integer time": trace_bytes(event(ts=2**60)),
    "int beyond int64": trace_bytes(event(args={"External id": 2**64})),
    "args not an object": trace_bytes(event(args=[1])),
    "lone surrogate": b'{"traceEvents": [{"ph": "X", "name": "\\ud800", "ts": 1, "dur": 1}]}',
    "invalid utf-8": b'{"traceEvents": [{"ph": "X", "name": "\xff", "ts": 1, "dur": 1}]}',
    "NaN": b'{"traceEvents": [{"ph": "X", "ts": NaN, "dur": 1}]}',
    "trailing comma": b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1},]}',
    "trailing garbage": b'{"traceEvents": []} x',
    "cut": b'{"traceEvents": [{"ph": "X", "ts": 1',
    "no traceEvents": b'{"a": 1}',
    "events not a list": b'{"traceEvents": 5}',
    "event not an object": b'{"traceEvents": [1]}',
    "too deep": b'{"traceEvents": [{"x": ' + b"[" * 300 + b"]" * 300 + b"}]}",
    "NUL inside": b'{"traceEvents": []}\x00',
    "leading zero": b'{"traceEvents": [{"ph": "X", "ts": 01, "dur": 1}]}',
    "control character in a string": b'{"traceEvents": [{"ph": "X\x01", "ts": 1, "dur": 1}]}',
}


@pytest.mark.parametrize("name", SAME)
def test_scanner_matches_msgspec(name: str) -> None:
    fast, slow = both(SAME[name], Path(f"{name}.rank0.json"))
    assert fast is not None, "declined"
    assert_same(fast, slow)


@pytest.mark.parametrize("name", DECLINED)
def test_scanner_declines_what_it_is_not_sure_of(name: str) -> None:
    assert kineto_decode._decoded_fast(DECLINED[name], Path("x.json")) is None
    _, slow = both(DECLINED[name], Path("x.json"))  # read, or refused with a TracekitError
    assert isinstance(slow, (tuple, TracekitError))


def test_decline_still_reads_or_words_the_error(tmp_path: Path) -> None:
    """Declined files go through the msgspec path: read (a duplicate key: the last wins) or
    refused in one line naming the file."""
    path = tmp_path / "dup.rank1.json"
    path.write_bytes(DECLINED["duplicate key"])
    info, frame = kineto.read_trace(path)
    assert frame["start_ns"].to_list() == [2000] and info.rank == 1
    path.write_bytes(DECLINED["trailing comma"])
    with pytest.raises(TracekitError, match="not valid JSON") as caught:
        kineto.read_trace(path)
    assert str(path) in str(caught.value)


@pytest.mark.corpus
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_traces_same_or_declined(data: st.DataObject) -> None:
    """Real traces with values replaced and bytes cut, flipped or inserted: same result as the
    msgspec path (or its same error), or declined; never accepted where msgspec refuses."""
    blob = data.draw(damaged(data.draw(st.sampled_from(SEEDS))))
    if blob[:2] == b"\x1f\x8b":
        try:
            blob = gzip.decompress(blob)
        except Exception:  # noqa: BLE001 - damaged gzip is read_bytes' business, tested elsewhere
            return
    fast, slow = both(blob, Path("damaged.rank2.json"))
    if fast is not None:
        assert_same(fast, slow)
