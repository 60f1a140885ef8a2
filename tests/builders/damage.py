"""Real traces damaged on purpose: a hypothesis strategy for the bad-input tests.

``damaged(seed)`` changes a real trace in JSON (values of events, args and top-level keys
replaced by any JSON value) and/or in bytes (cut, flipped, inserted), gzipped or not. ``SEEDS``:
two small real traces, a gloo CPU rank and the first events of a GPU rank with its collectives.
"""

from __future__ import annotations

import gzip
import json

from hypothesis import strategies as st

from .traces import NCCL_DATA, read_gz, small_trace

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARG_KEYS = [
    "stream",
    "correlation",
    "External id",
    "Input Dims",
    "Input type",
    "Concrete Inputs",
    "Collective name",
    "In msg nelems",
    "dtype",
    "Group size",
    "Process Group Ranks",
    "name",
]
TOP_KEYS = ["distributedInfo", "baseTimeNanoseconds", "deviceProperties", "host_name"]


@st.composite
def damaged(draw: st.DrawFn, seed: dict) -> bytes:
    """A real trace, changed in JSON (values replaced) and/or in bytes (cut, flipped, inserted)."""
    trace = json.loads(json.dumps(seed))
    events = trace["traceEvents"]
    for _ in range(draw(st.integers(0, 4))):
        where = draw(st.sampled_from(["event", "arg", "top", "rank"]))
        value = draw(JSON_VALUES)
        if where == "event":
            events[draw(st.integers(0, len(events) - 1))][draw(st.sampled_from(EVENT_KEYS))] = value
        elif where == "arg":
            event = events[draw(st.integers(0, len(events) - 1))]
            if isinstance(event.get("args"), dict):
                event["args"][draw(st.sampled_from(ARG_KEYS))] = value
        elif where == "top":
            trace[draw(st.sampled_from(TOP_KEYS))] = value
        elif isinstance(trace.get("distributedInfo"), dict):
            trace["distributedInfo"][draw(st.sampled_from(["rank", "pg_config"]))] = value
    data = bytearray(json.dumps(trace).encode())
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["cut", "flip", "insert"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "cut":
            del data[at:]
        elif op == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
    return gzip.compress(bytes(data)) if draw(st.booleans()) else bytes(data)


def seed_traces() -> list[dict]:
    """Two small real traces: gloo CPU (cpu_only) and the first events of a GPU rank."""
    gpu = read_gz(NCCL_DATA)
    comm = [e for e in gpu["traceEvents"] if "Collective name" in e.get("args", {})][:6]
    gpu["traceEvents"] = [e for e in gpu["traceEvents"][:150] if e.get("ph") in ("X", "M")] + comm
    return [small_trace(), gpu]


#: none without the corpus (tests/builders/corpus_root.py): the tests drawing from them are marked corpus
SEEDS = seed_traces() if NCCL_DATA.is_file() else []
