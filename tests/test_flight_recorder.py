"""Flight-recorder JSON dumps: real ones from a 2-rank gloo job, committed and generated live.

tests/data/nccl/fr_rank{0,1}.json were written by FR_SCRIPT below under torch 2.13.0 (CPU);
the module fixture runs the same script again so the installed torch is exercised too.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import hypothesis.strategies as st
import polars as pl
import pytest
from conftest import torchrun
from hypothesis import HealthCheck, given, settings

from tracekit.errors import TracekitError
from tracekit.ingest import flight_recorder as fr
from tracekit.ingest.flight_recorder import read_flight_record, read_flight_records

DATA = Path(__file__).parent / "data" / "nccl"

FR_SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
r = dist.get_rank()
dist.all_reduce(torch.ones(8, dtype=torch.float32))
dist.all_gather_into_tensor(torch.empty(16), torch.ones(8))
dist.reduce_scatter_tensor(torch.empty(4, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16))
dist.broadcast(torch.zeros(3, 5, dtype=torch.float64), src=0)
if r == 0:
    dist.send(torch.arange(6), dst=1)
else:
    dist.recv(torch.empty(6, dtype=torch.int64), src=0)
dist.barrier()
pair = dist.new_group([0, 1], group_desc="pair")
dist.all_reduce(torch.ones(10, dtype=torch.float16), group=pair)
dist.all_reduce(torch.ones(10, dtype=torch.float16), group=pair)
solo = dist.new_group([1], group_desc="solo")
if r == 1:
    dist.all_reduce(torch.ones(3, dtype=torch.int32), group=solo)
dump = torch._C._distributed_c10d._dump_fr_trace_json()
if isinstance(dump, str):
    dump = dump.encode()
with open(os.path.join(sys.argv[1], f"fr_rank{r}.json"), "wb") as f:
    f.write(dump)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def live_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fr")
    script = out / "fr_job.py"
    script.write_text(FR_SCRIPT)
    torchrun(script, out, timeout=180)
    return out


@pytest.fixture(params=["committed", "live"])
def records(request) -> list[fr.FlightRecord]:
    if request.param == "committed":
        return read_flight_records([DATA / "fr_rank0.json", DATA / "fr_rank1.json"])
    return read_flight_records(request.getfixturevalue("live_dir"))


def by_group(rec: fr.FlightRecord, desc: str) -> pl.DataFrame:
    return rec.entries.filter(pl.col("pg_desc") == desc).sort("collective_seq_id")


# -- what the job did ---------------------------------------------------------------------------
def test_ranks_version_and_no_timings(records):
    assert [r.rank for r in records] == [0, 1]
    for rec in records:
        assert rec.version == "2.10"
        assert rec.warnings == ()
        e = rec.entries
        assert e["rank"].unique().to_list() == [rec.rank]
        # gloo: nothing fills started/completed/duration, state stays "scheduled"
        assert e["started_ns"].null_count() == e.height
        assert e["completed_ns"].null_count() == e.height
        assert e["duration_ms"].null_count() == e.height
        assert set(e["state"]) == {"scheduled"}
        assert e["time_created_ns"].min() > 1_600_000_000 * 10**9  # epoch ns
        assert e["time_created_ns"].is_sorted()


def test_default_group_ops_and_sizes(records):
    for rec in records:
        d = by_group(rec, "default_pg")
        assert d["pg_name"].unique().to_list() == ["0"]
        assert d["collective_seq_id"].to_list() == [1, 2, 3, 4, 5]
        # reduce_scatter_tensor shows up as gloo:all_reduce of the full input (gloo has none)
        assert d["profiling_name"].to_list() == [
            "gloo:all_reduce",
            "gloo:all_gather",
            "gloo:all_reduce",
            "gloo:broadcast",
            "gloo:barrier",
        ]
        assert d["op"].to_list() == [
            "all_reduce",
            "all_gather",
            "all_reduce",
            "broadcast",
            "barrier",
        ]
        assert d["input_sizes"].to_list() == [[[8]], [[8]], [[8]], [[3, 5]], []]
        assert d["output_sizes"].to_list() == [[[8]], [[2, 8]], [[8]], [[3, 5]], []]
        assert d["in_bytes"].to_list() == [32, 32, 16, 120, 0]
        assert d["out_bytes"].to_list() == [32, 64, 16, 120, 0]
        assert d["dtype"].to_list() == ["Float", "Float", "BFloat16", "Double", None]


def test_send_recv_leave_no_entry_only_an_op_id(records):
    for rec in records:
        e = rec.entries
        assert not e["is_p2p"].any()
        assert e.filter(pl.col("op").is_in(["send", "recv"])).height == 0
        d = by_group(rec, "default_pg")
        op_ids = dict(zip(d["op"].to_list()[3:], d["op_id"].to_list()[3:]))
        assert op_ids["barrier"] - op_ids["broadcast"] == 2  # the send/recv took one


def test_second_and_third_groups_carry_name_desc_and_ranks(records):
    for rec in records:
        pair = by_group(rec, "pair")
        assert pair["pg_name"].unique().to_list() == ["1"]
        assert pair["collective_seq_id"].to_list() == [1, 2]  # counts per group
        assert pair["in_bytes"].to_list() == [20, 20]
        assert pair["dtype"].unique().to_list() == ["Half"]
        solo = by_group(rec, "solo")
        assert solo.height == (1 if rec.rank == 1 else 0)
        groups = {r["pg_desc"]: r for r in rec.groups.to_dicts()}
        assert "" not in rec.groups["pg_name"].to_list()  # gloo's pg_config placeholder
        assert groups["default_pg"]["ranks"] == [0, 1]
        assert groups["pair"]["ranks"] == [0, 1]
        assert groups["pair"]["ranks_source"] == "entries"
        if rec.rank == 1:
            assert groups["solo"] == {
                "pg_name": "2",
                "pg_desc": "solo",
                "pg_id": 2,
                "ranks": [1],
                "ranks_source": "entries",
            }


def test_seq_ids_increase_per_group_on_every_rank(records):
    for rec in records:
        for _, g in rec.entries.group_by("pg_name"):
            seq = g.sort("record_id")["collective_seq_id"].to_list()
            assert seq == list(range(1, len(seq) + 1))


def test_the_real_dump_keys(records):
    raw = json.loads(Path(records[0].path).read_bytes())
    assert set(raw) == {
        "version",
        "comm_lib_version",
        "pg_config",
        "pg_status",
        "entries",
        "nccl_comm_state",
    }
    assert raw["pg_config"] == {"": {"desc": "", "name": "", "ranks": "[]"}}
    assert set(raw["entries"][0]) == {
        "collective_seq_id",
        "input_dtypes",
        "input_sizes",
        "is_p2p",
        "op_id",
        "output_dtypes",
        "output_sizes",
        "p2p_seq_id",
        "pg_id",
        "process_group",
        "profiling_name",
        "record_id",
        "retired",
        "state",
        "thread_id",
        "thread_name",
        "time_created_ns",
        "time_discovered_completed_ns",
        "time_discovered_started_ns",
        "timeout_ms",
    }


# -- rank and pg_config handling ----------------------------------------------------------------
def test_rank_from_argument_name_or_dump(tmp_path):
    data = json.loads((DATA / "fr_rank1.json").read_bytes())
    (tmp_path / "nccl_trace_rank_7").write_text(json.dumps(data))
    assert read_flight_record(tmp_path / "nccl_trace_rank_7").rank == 7
    (tmp_path / "dump.json").write_text(json.dumps(data))
    rec = read_flight_record(tmp_path / "dump.json")
    assert rec.rank is None and "no rank" in rec.warnings[0]
    assert read_flight_record(tmp_path / "dump.json", rank=3).entries[
        "rank"
    ].unique().to_list() == [3]
    (tmp_path / "with_rank.json").write_text(json.dumps({**data, "rank": 5}))
    assert read_flight_record(tmp_path / "with_rank.json", rank=3).rank == 5


def test_pg_config_ranks_string_as_nccl_writes_it(tmp_path):
    """NCCL dumps fill pg_config; ranks is the string fmt::format("[{}]", join(ranks, ", "))."""
    data = json.loads((DATA / "fr_rank0.json").read_bytes())
    data["pg_config"] = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
        "1": {"name": "1", "desc": "undefined", "ranks": "[1]"},
    }
    (tmp_path / "fr_rank0.json").write_text(json.dumps(data))
    groups = read_flight_record(tmp_path / "fr_rank0.json").groups
    assert groups.sort("pg_name")["ranks"].to_list() == [[0, 1], [1]]
    assert set(groups["ranks_source"]) == {"pg_config"}


def test_unknown_dtype_gives_null_bytes_and_a_warning(tmp_path):
    data = json.loads((DATA / "fr_rank0.json").read_bytes())
    data["entries"][0]["input_dtypes"] = ["SomeFutureType"]
    (tmp_path / "fr_rank0.json").write_text(json.dumps(data))
    rec = read_flight_record(tmp_path / "fr_rank0.json")
    assert rec.entries["in_bytes"][0] is None and rec.entries["out_bytes"][0] == 32
    assert "unknown size" in rec.warnings[0]


def test_op_names():
    assert fr.op_name("nccl:_reduce_scatter_base") == "reduce_scatter"
    assert fr.op_name("nccl:all_gather_into_tensor_coalesced") == "all_gather"
    assert fr.op_name("nccl:send 0->1") == "send"
    assert fr.op_name("gloo:gather") is None


# -- bad input: always a TracekitError naming the file ------------------------------------------
def bad(path: Path) -> str:
    with pytest.raises(TracekitError) as info:
        read_flight_record(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_empty_file(tmp_path):
    (tmp_path / "fr_rank0.json").write_bytes(b"")
    assert "empty" in bad(tmp_path / "fr_rank0.json")


def test_binary_garbage(tmp_path):
    (tmp_path / "fr_rank0.json").write_bytes(bytes(range(256)) * 8)
    assert fr.NOT_JSON in bad(tmp_path / "fr_rank0.json")


def test_pickle_is_refused_and_never_unpickled(tmp_path, monkeypatch):
    data = json.loads((DATA / "fr_rank0.json").read_bytes())
    (tmp_path / "fr_rank0.json").write_bytes(pickle.dumps(data))

    def forbidden(*a, **k):
        raise AssertionError("a dump was unpickled")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    assert "not JSON (pickled dumps are never loaded)" in bad(tmp_path / "fr_rank0.json")


def test_truncated_json(tmp_path):
    raw = (DATA / "fr_rank0.json").read_bytes()
    (tmp_path / "fr_rank0.json").write_bytes(raw[: len(raw) // 2])
    assert "truncated" in bad(tmp_path / "fr_rank0.json")


def test_json_that_is_not_a_dump(tmp_path):
    (tmp_path / "a.json").write_text("[1, 2, 3]")
    assert "not a flight-recorder dump" in bad(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"traceEvents": []}')
    assert "not a flight-recorder dump" in bad(tmp_path / "b.json")


def test_missing_paths_and_empty_folders(tmp_path):
    with pytest.raises(TracekitError, match="no such file"):
        read_flight_records(tmp_path / "nope")
    with pytest.raises(TracekitError, match="no flight-recorder dumps"):
        read_flight_records(tmp_path)
    with pytest.raises(TracekitError, match="cannot read|folder"):
        read_flight_record(tmp_path)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=400))
def test_any_bytes_give_a_record_or_a_tracekit_error(tmp_path, blob):
    path = tmp_path / "fr_rank0.json"
    path.write_bytes(blob)
    try:
        read_flight_record(path)
    except TracekitError as exc:
        assert str(path) in str(exc)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
ENTRY_KEYS = sorted(json.loads((DATA / "fr_rank0.json").read_bytes())["entries"][0])


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.sampled_from(ENTRY_KEYS + ["pg_config", "pg_status", "version", "rank"]), value=JSON)
def test_any_odd_field_value_gives_a_record_or_a_tracekit_error(tmp_path, key, value):
    data = json.loads((DATA / "fr_rank1.json").read_bytes())
    if key in ENTRY_KEYS:
        data["entries"][0][key] = value
    else:
        data[key] = value
    path = tmp_path / "fr_rank1.json"
    path.write_text(json.dumps(data))
    try:
        rec = read_flight_record(path)
    except TracekitError as exc:
        assert str(path) in str(exc)
        return
    assert rec.entries.height in (7, 8)  # at most the one damaged entry is dropped
