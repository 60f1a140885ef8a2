"""Ingest of Kineto traces: real GPU/CPU traces from HTA, a real 2-rank gloo run, bad input.

No mocks: every trace here was written by torch.profiler (HTA's tests/data, or the gloo job
this module starts); bad inputs are real traces damaged on purpose.
"""

from __future__ import annotations

import gzip
import json
import math
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import polars as pl
import pytest
from builders.corpus_root import HTA_FOLDERS
from builders.damage import SEEDS, damaged, seed_traces
from builders.traces import CPU_ONLY, NCCL_DATA, small_trace
from conftest import HTA, torchrun
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.errors import TracekitError
from tracekit.events import EVENT_SCHEMA, KINDS
from tracekit.ingest import TraceInfo, read_trace, read_traces
from tracekit.ingest.kineto import _default_workers
from tracekit.ingest.kineto_files import _gunzip
from tracekit.ingest.kineto_info import NO_RANK_WARNING
from tracekit.runfolder import find_trace_files

TRACE_FILTER = [HTA / "trace_filter" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
AMD = HTA / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
ALEXNET = HTA / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"
NO_RANK = HTA / "rank_unavailable" / "rank_not_found.json.gz"
NO_DIST = HTA / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"


def check_frame(frame: pl.DataFrame) -> None:
    """The events-table contract every reader output must meet."""
    assert frame.schema == pl.Schema(EVENT_SCHEMA)
    assert set(frame["kind"].unique()) <= set(KINDS)
    assert set(frame["device"].unique()) <= {"cpu", "gpu"}
    assert (frame["end_ns"] >= frame["start_ns"]).all()


def rows(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    return frame.filter(pl.col("name") == name)


# --- every HTA folder ----------------------------------------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize("folder", HTA_FOLDERS)
def test_every_hta_folder_parses_or_fails_clearly(folder: str) -> None:
    files = find_trace_files(HTA / folder)
    assert files
    try:
        infos, frame = read_traces(files)
    except TracekitError as err:  # allowed, but it must say which file and what
        assert str(HTA / folder) in str(err)
        return
    check_frame(frame)
    assert [i.rank for i in infos] == sorted(i.rank for i in infos)
    assert frame.height == sum(frame["rank"].value_counts()["count"])


@pytest.mark.corpus
def test_trace_filter_two_ranks() -> None:
    infos, frame = read_traces(TRACE_FILTER, workers=2)
    check_frame(frame)
    assert [(i.rank, i.rank_source, i.world_size, i.backend) for i in infos] == [
        (0, "distributedInfo", 128, "nccl"),
        (1, "distributedInfo", 128, "nccl"),
    ]
    assert frame.group_by("rank").len().sort("rank")["len"].to_list() == [4811, 4676]
    assert all(i.has_gpu and i.profiler_steps == 2 and i.base_ns is None for i in infos)
    sendrecv = frame.filter(pl.col("name").str.starts_with("ncclKernel_SendRecv"))
    assert sendrecv.height == 20
    assert (sendrecv["kind"] == "communication").all() and sendrecv["op"].is_null().all()
    assert (sendrecv["device"] == "gpu").all() and sendrecv["stream"].is_in([84, 203]).all()
    # the nccl:* cpu marks are annotations that carry their input size
    ar = rows(frame, "nccl:all_reduce").filter(pl.col("rank") == 0)
    assert (ar["kind"] == "annotation").all() and (ar["op"] == "all_reduce").all()
    assert ar["bytes"].to_list()[0] == 19618307 * 4
    # the c10d base op records the all-gather output: S directly
    ag = rows(frame, "c10d::_allgather_base_").filter(pl.col("rank") == 0)
    assert ag["op"].to_list() == ["all_gather"] * 2 and ag["bytes"].to_list() == [2**30] * 2
    # nccl:_all_gather_base records the per-rank input; no group size known -> null + warning
    assert rows(frame, "nccl:_all_gather_base")["bytes"].is_null().all()
    assert any("group size is unknown" in w for w in infos[0].warnings)
    # absolute integer microseconds, no base
    first = frame.filter(pl.col("rank") == 0).sort("start_ns")["start_ns"][0]
    assert 1_682_725_000_000_000_000 < first < 1_682_726_000_000_000_000


@pytest.mark.corpus
def test_nccl_data_record_param_comms() -> None:
    info, frame = read_trace(NCCL_DATA)
    check_frame(frame)
    assert (info.rank, info.world_size, info.backend, info.rank_source) == (
        0,
        2,
        "nccl",
        "distributedInfo",
    )
    assert info.pg_config[0]["pg_size"] == 2 and len(info.device_properties) == 8
    assert frame.height == 26933 and info.profiler_steps == 3 and info.has_gpu
    kernels = frame.filter(pl.col("name").str.starts_with("ncclKernel_"))
    assert kernels.height == 21 and (kernels["kind"] == "communication").all()
    assert kernels["op"].value_counts().sort("op").rows() == [("all_reduce", 15), ("broadcast", 6)]
    assert kernels["correlation"].is_not_null().all() and (kernels["stream"] == 40).all()
    rpc = rows(frame, "record_param_comms").filter(pl.col("op").is_not_null())
    assert (rpc["kind"] == "communication").all()
    assert set(rpc["group"]) == {"0"} and set(rpc["group_ranks"]) == {"[0, 1]"}
    assert set(rpc["group_size"]) == {2}
    first_ar = rpc.filter(pl.col("op") == "all_reduce").sort("start_ns").row(0, named=True)
    assert (first_ar["bytes"], first_ar["dtype"]) == (2049000 * 4, "float32")
    long_bc = rpc.filter(pl.col("dtype") == "int64").row(0, named=True)
    assert (long_bc["op"], long_bc["bytes"]) == ("broadcast", 53 * 8)
    # the kernels carry the same args: same bytes per External id
    joined = kernels.join(rpc, on="external_id", suffix="_cpu")
    assert joined.height == 21 and (joined["bytes"] == joined["bytes_cpu"]).all()
    assert rows(frame, "nccl:all_reduce").filter(pl.col("device") == "cpu")[
        "kind"
    ].unique().to_list() == ["annotation"]
    assert frame.filter(pl.col("cat") == "gpu_memcpy")["kind"].unique().to_list() == ["memory"]
    assert frame.filter(pl.col("cat") == "cuda_runtime")["kind"].unique().to_list() == ["runtime"]
    # thread names kept in full, both names of a thread that Kineto named twice
    names = frame.filter(pl.col("tid") == "2919752")["thread_name"].unique().to_list()
    assert names == ["thread 2919752 (pt_main_thread) | thread 2919752 (pt_autograd_0)"]


@pytest.mark.corpus
def test_cpu_only_gloo_rank_34() -> None:
    info, frame = read_trace(CPU_ONLY)
    check_frame(frame)
    assert (info.rank, info.world_size, info.backend) == (34, 300, "gloo")
    assert len(info.pg_config) == 11 and not info.has_gpu and info.profiler_steps == 1
    assert frame.height == 16 and set(frame["pid"]) == {"1074", "Spans"}
    gloo = rows(frame, "gloo:all_reduce")
    assert gloo.height == 10 and (gloo["kind"] == "communication").all()
    by_tid = dict(gloo.group_by("tid").agg(pl.col("bytes").unique()).rows())
    assert by_tid == {"3553": [321271 * 4], "3554": [2082411 * 4]}
    # the runloop threads of this older torch are named pt_main_thread: kept as given
    assert set(gloo["thread_name"]) == {
        "thread 3553 (pt_main_thread)",
        "thread 3554 (pt_main_thread)",
    }
    # 11 groups, all of 300 ranks: the size is known although the group is not
    assert (gloo["group_size"] == 300).all() and gloo["group"].is_null().all()
    assert info.base_ns == 1719853884000000000
    assert frame["start_ns"].min() > info.base_ns


@pytest.mark.corpus
def test_amd_trace_rank_default_not_from_digits() -> None:
    info, frame = read_trace(AMD)
    check_frame(frame)
    assert (info.rank, info.rank_source) == (0, "default")
    assert NO_RANK_WARNING in info.warnings
    kernels = frame.filter(pl.col("cat") == "kernel")
    assert kernels.height == 14 and (kernels["kind"] == "compute").all()
    assert not (frame["kind"] == "communication").any() and info.has_gpu
    # the runtime rows carry a text stream arg; only GPU rows get a stream
    assert frame.filter(pl.col("device") == "cpu")["stream"].is_null().all()


@pytest.mark.corpus
@pytest.mark.parametrize("path", [NO_RANK, NO_DIST])
def test_traces_without_rank(path: Path) -> None:
    info, frame = read_trace(path)
    check_frame(frame)
    assert (info.rank, info.rank_source, frame.height) == (0, "default", 2467)
    assert NO_RANK_WARNING in info.warnings
    with pytest.raises(TracekitError, match="no rank"):
        read_traces([NO_RANK, NO_DIST], workers=1)


@pytest.mark.corpus
def test_alexnet_sync_events() -> None:
    info, frame = read_trace(ALEXNET)
    check_frame(frame)
    sync = frame.filter(pl.col("kind") == "sync")
    assert sync.height == 41 and (sync["device"] == "gpu").all()
    assert sync["stream"].is_not_null().all() and info.rank == 0


@pytest.mark.corpus
def test_nccl_data_reads_the_same_twice() -> None:
    """Its parse time (about 0.15 s; HTA ~0.8 s) is benchmarks/timing_bounds.py's: a loaded
    machine cannot judge wall time. Here: a second read gives what the first gave."""
    info, frame = read_trace(NCCL_DATA)
    again_info, again = read_trace(NCCL_DATA)
    assert info == again_info and frame.equals(again) and frame.height > 0


# --- a real 2-rank gloo run --------------------------------------------------------------

GLOO_JOB = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    def main(out):
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 32)
        x = torch.randn(8, 64)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            with record_function("label:forward_backward"):
                model(x).sum().backward()
            work = dist.all_reduce(torch.ones(1000), async_op=True)
            work.wait()
            dist.all_gather([torch.empty(300) for _ in range(world)], torch.ones(300))
            dist.reduce_scatter_tensor(torch.empty(500, dtype=torch.float64),
                                       torch.ones(500 * world, dtype=torch.float64))
            dist.broadcast(torch.ones(700, dtype=torch.bfloat16), src=0)
            if rank == 0:
                dist.send(torch.ones(400), dst=1)
            else:
                dist.recv(torch.empty(400), src=0)
            dist.barrier()
        prof.export_chrome_trace(os.path.join(out, f"trace.rank{rank}.json.gz"))
        dist.destroy_process_group()

    if __name__ == "__main__":
        main(sys.argv[1])
""")


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("gloo")
    script = root / "job.py"
    script.write_text(GLOO_JOB)
    torchrun(script, root, timeout=240)
    paths = [root / f"trace.rank{r}.json.gz" for r in (0, 1)]
    assert all(p.is_file() for p in paths)
    return paths


@pytest.mark.slow
def test_gloo_run_both_ranks_in_parallel(gloo_traces: list[Path]) -> None:
    infos, frame = read_traces(list(reversed(gloo_traces)), workers=2)
    check_frame(frame)
    assert [(i.rank, i.rank_source, i.world_size, i.backend) for i in infos] == [
        (0, "distributedInfo", 2, "gloo"),
        (1, "distributedInfo", 2, "gloo"),
    ]
    assert all(i.base_ns and i.host_name and len(i.pg_config) == 1 for i in infos)
    assert all(not i.has_gpu and i.warnings == () for i in infos)
    assert frame["rank"].unique().sort().to_list() == [0, 1]
    assert frame["start_ns"].min() > infos[0].base_ns


GLOO_SPANS = {  # name -> (op, bytes, dtype) on every rank: S from the tensors the job used
    "gloo:all_gather": ("all_gather", 2 * 300 * 4, "float32"),  # S = output = n x input
    "gloo:broadcast": ("broadcast", 700 * 2, "bfloat16"),
    "gloo:barrier": ("barrier", 0, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_collective_columns(gloo_traces: list[Path], rank: int) -> None:
    info, frame = read_trace(gloo_traces[rank])
    check_frame(frame)
    comm = frame.filter(pl.col("kind") == "communication")
    for name, expected in GLOO_SPANS.items():
        got = rows(comm, name).select("op", "bytes", "dtype").unique().rows()
        assert got == [expected], name
    # all_reduce of 1000 floats, and reduce_scatter that gloo runs as an all_reduce of the input
    assert sorted(rows(comm, "gloo:all_reduce").select("bytes", "dtype").rows()) == [
        (4000, "float32"),
        (8000, "float64"),
    ]
    # the gloo collectives run on runloop threads; p2p runs on the calling thread
    runloop = comm.filter(
        pl.col("name").str.starts_with("gloo:") & ~pl.col("op").is_in(["send", "recv"])
    )
    assert runloop["thread_name"].str.contains("pt_gloo_runloop").all()
    assert set(comm["group_size"].drop_nulls()) == {2} and comm["group"].is_null().all()
    # the calling-thread c10d ops
    assert rows(comm, "c10d::_reduce_scatter_base_").select("op", "bytes", "dtype").row(0) == (
        "reduce_scatter",
        1000 * 8,
        "float64",
    )
    allreduce = rows(comm, "c10d::allreduce_").row(0, named=True)
    assert allreduce["op"] == "all_reduce" and allreduce["bytes"] is None  # TensorList: no dtype
    assert rows(comm, "c10d::allgather_")["op"].to_list() == ["all_gather"]
    assert rows(comm, "c10d::barrier")["bytes"].to_list() == [0]
    p2p_call, p2p_span, peer = (
        ("c10d::send", "gloo:send", 1) if rank == 0 else ("c10d::recv_", "gloo:recv", 0)
    )
    assert rows(comm, p2p_call).select("op", "peer").row(0) == (p2p_span[5:], peer)
    span = rows(comm, p2p_span).row(0, named=True)
    assert (span["op"], span["bytes"], span["dtype"]) == (p2p_span[5:], 1600, "float32")
    assert "pt_gloo_runloop" not in (span["thread_name"] or "")
    # compute and labels
    assert (rows(frame, "aten::addmm")["kind"] == "compute").all()
    assert rows(frame, "label:forward_backward")["kind"].to_list() == ["annotation"]
    assert frame.filter(pl.col("kind") == "compute")["op"].is_null().all()


# --- bad input -----------------------------------------------------------------------------


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def expect_error(path: Path, match: str) -> TracekitError:
    with pytest.raises(TracekitError, match=match) as caught:
        read_trace(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    return caught.value


def test_missing_and_empty_files(tmp_path: Path) -> None:
    expect_error(tmp_path / "rank0.json", "cannot read")
    expect_error(write(tmp_path / "rank1.json", b""), "empty")
    expect_error(write(tmp_path / "rank2.json.gz", gzip.compress(b"")), "empty")


@pytest.mark.corpus
def test_damaged_gzip(tmp_path: Path) -> None:
    blob = CPU_ONLY.read_bytes()
    expect_error(write(tmp_path / "cut.json.gz", blob[: len(blob) // 2]), "truncated gzip")
    bad = bytearray(blob)
    for i in range(100, 140):
        bad[i] ^= 0x5A
    expect_error(write(tmp_path / "bad.json.gz", bytes(bad)), "gzip")


@pytest.mark.corpus
def test_gzip_members_and_trailer_sizes(tmp_path: Path) -> None:
    """Several gzip members are one file; the output buffer's first size comes from the last
    member's trailer, so a trailer that understates or overstates the size must not matter."""
    text = gzip.decompress(CPU_ONLY.read_bytes())
    _, want = read_trace(write(tmp_path / "whole.rank1.json", text))
    half = len(text) // 2
    two = gzip.compress(text[:half]) + gzip.compress(text[half:])  # trailer: the second half only
    _, got = read_trace(write(tmp_path / "two.rank1.json.gz", two))
    assert got.equals(want)
    big = bytearray(gzip.compress(text))
    big[-4:] = (len(text) * 3).to_bytes(4, "little")  # overstated: gzip checks ISIZE itself
    expect_error(write(tmp_path / "lying.rank1.json.gz", bytes(big)), "gzip")


@pytest.mark.corpus
def test_gunzip_in_slices_is_gzip_decompress() -> None:
    """The input goes to zlib in 8 KB slices: members that end inside a slice or exactly at
    its end, empty members, zero padding and any first buffer size give gzip's own output;
    a member cut anywhere is a truncated file."""
    text = gzip.decompress(NCCL_DATA.read_bytes())  # 9.8 MB: its gzip spans many slices
    cuts = [0, 0, 1, 9000, len(text) // 3, len(text)]
    blob = b"".join(gzip.compress(text[a:b], 6) for a, b in zip(cuts, cuts[1:]))
    for data in (blob, blob + bytes(100)):
        for hint in (0, 4096, len(text), 3 * len(text)):
            assert _gunzip(data, 2**40, "", Path("x.json.gz"), hint) == text
    one = gzip.compress(text, 6)
    stored = gzip.compress(text[:8169], 0)  # stored, not deflated: ends at a slice's end
    assert len(stored) == 8192
    assert _gunzip(stored + one, 2**40, "", Path("x"), 0) == text[:8169] + text
    for cut in (10, 8192, len(one) // 2, len(one) - 1):
        with pytest.raises(TracekitError, match="truncated gzip"):
            _gunzip(one[:cut], 2**40, "", Path("x"), 0)
    with pytest.raises(TracekitError, match="corrupt gzip"):
        _gunzip(one + b"garbage after the member", 2**40, "", Path("x"), 0)


def test_gzip_bomb_stops_near_the_limit_whatever_the_trailer_says() -> None:
    """512 MB of zeros (~0.5 MB of gzip), a 4 MB limit and a trailer that lies: refused after
    holding about the limit, never the bomb's size (tracemalloc counts the buffers zlib and
    the output take)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(2**20)
    bomb = b"".join([*(c.compress(block) for _ in range(512)), c.flush()])
    for trailer in (bomb[-4:], (100).to_bytes(4, "little")):
        tracemalloc.start()
        try:
            with pytest.raises(TracekitError, match="more than .* once uncompressed"):
                _gunzip(bomb[:-4] + trailer, 4 * 2**20, "test", Path("bomb.json.gz"), 4096)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 * 2**20, peak  # limit + a few 2 MB zlib outputs


@pytest.mark.corpus
def test_damaged_json(tmp_path: Path) -> None:
    text = json.dumps(small_trace()).encode()
    expect_error(write(tmp_path / "cut.json", text[: len(text) // 2]), "not valid JSON")
    expect_error(write(tmp_path / "obj.json", b"{}"), "not a Kineto trace.*traceEvents")
    expect_error(write(tmp_path / "arr.json", b"[]"), "not a Kineto trace")
    expect_error(write(tmp_path / "five.json", b'{"traceEvents": 5}'), "not a Kineto trace")
    expect_error(
        write(tmp_path / "args.json", b'{"traceEvents": [{"ph": "X", "args": [1]}]}'),
        "not a Kineto trace",
    )
    utf8 = text.replace(b"gloo:all_reduce", b"gloo:\xff\xfeall_reduce", 1)
    expect_error(write(tmp_path / "utf8.json", utf8), "not valid JSON.*UTF-8")
    expect_error(
        write(
            tmp_path / "deep.json",
            b'{"traceEvents": [{"args": {"name": ' + b"[" * 5000 + b"]" * 5000 + b"}}]}",
        ),
        "nested too deeply",
    )
    expect_error(
        write(tmp_path / "digits.json", b'{"traceEvents": [{"ts": ' + b"7" * 5000 + b"}]}"),
        "not a Kineto trace",
    )


@pytest.mark.corpus
def test_bad_durations_are_dropped_with_one_warning(tmp_path: Path) -> None:
    trace = small_trace()
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    xs[0]["dur"] = -1.0
    xs[1]["dur"] = float("nan")  # json.dumps writes a bare NaN token
    del xs[2]["dur"]
    xs[3]["ts"] = "soon"
    xs[4]["dur"] = float("inf")
    info, frame = read_trace(write(tmp_path / "rank-34.json", json.dumps(trace).encode()))
    check_frame(frame)
    assert frame.height == 16 - 5
    assert info.warnings == (
        "dropped 5 events with missing/negative/NaN durations or non-numeric timestamps",
    )


@pytest.mark.corpus
def test_huge_integers(tmp_path: Path) -> None:
    trace = small_trace()
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    xs[0]["ts"] = 10**30
    xs[1]["dur"] = 2**64 + 1
    xs[2]["pid"] = 10**30
    xs[3]["args"]["External id"] = 10**40
    xs[4]["args"]["Input Dims"] = [[10**30]]
    trace["distributedInfo"]["rank"] = 10**30
    trace["baseTimeNanoseconds"] = 10**30
    path = write(tmp_path / "huge.json", json.dumps(trace).encode())
    info, frame = read_trace(path)
    check_frame(frame)
    assert (info.rank, info.rank_source, info.base_ns) == (0, "default", None)
    assert any("do not fit in 64-bit" in w for w in info.warnings)
    assert any("is not a rank" in w for w in info.warnings)
    assert any("baseTimeNanoseconds" in w for w in info.warnings)
    assert frame.height == 14 and "1" + "0" * 30 in set(frame["pid"])
    assert frame["bytes"].is_not_null().sum() >= 1
    # a number beyond float range: parsed through the stdlib, then dropped as missing
    text = json.dumps(small_trace()).replace('"dur": 173209.713', '"dur": 1e400', 1)
    info, frame = read_trace(write(tmp_path / "big.json", text.encode()))
    assert frame.height == 15 and len(info.warnings) == 1


@pytest.mark.corpus
def test_collective_sizes_that_overflow_are_null(tmp_path: Path) -> None:
    trace = seed_traces()[1]
    comm = [e for e in trace["traceEvents"] if "Collective name" in e.get("args", {})]
    comm[0]["args"]["In msg nelems"] = 2**61  # x 4 bytes overflows int64
    comm[1]["args"]["In msg nelems"] = -5
    info, frame = read_trace(write(tmp_path / "rank0.json", json.dumps(trace).encode()))
    check_frame(frame)
    sizes = frame.filter(pl.col("external_id").is_in([e["args"]["External id"] for e in comm]))
    assert sizes.filter(pl.col("bytes").is_null()).height == 2
    assert sizes.filter(pl.col("bytes").is_not_null()).height == len(comm) - 2


@pytest.mark.corpus
def test_rank_sources(tmp_path: Path) -> None:
    trace = small_trace()
    del trace["distributedInfo"]
    text = json.dumps(trace).encode()
    named = write(tmp_path / "job_rank_3.json", text)
    info, _ = read_trace(named)
    assert (info.rank, info.rank_source, info.warnings) == (3, "filename", ())
    assert read_trace(named, rank=5)[0].rank_source == "argument"
    with pytest.raises(TracekitError, match="not a rank"):
        read_trace(named, rank=-1)
    huge = write(tmp_path / "rank99999999999.json", text)
    assert read_trace(huge)[0].rank_source == "default"
    lone = write(tmp_path / "mi250_ROCm6_2.json", text)
    info, frame = read_trace(lone)
    assert (info.rank, info.rank_source) == (0, "default") and set(frame["rank"]) == {0}
    with pytest.raises(TracekitError, match="no rank") as caught:
        read_traces([named, lone], workers=1)
    assert str(lone) in str(caught.value)
    # distributedInfo wins over the file name, with a warning
    info, _ = read_trace(write(tmp_path / "rank7.json", json.dumps(small_trace()).encode()))
    assert info.rank == 34 and any("file name says rank 7" in w for w in info.warnings)


@pytest.mark.corpus
def test_two_files_same_rank(tmp_path: Path) -> None:
    copy = write(tmp_path / "copy.json.gz", CPU_ONLY.read_bytes())
    with pytest.raises(TracekitError, match="rank 34 is claimed") as caught:
        read_traces([CPU_ONLY, copy], workers=1)
    assert str(copy) in str(caught.value) or str(CPU_ONLY) in str(caught.value)


@pytest.mark.corpus
def test_worker_error_reaches_caller_intact(tmp_path: Path) -> None:
    bad = write(tmp_path / "rank1.json.gz", CPU_ONLY.read_bytes()[:500])
    with pytest.raises(TracekitError) as caught:
        read_traces([CPU_ONLY, bad], workers=2)
    assert caught.value.path == str(bad)
    assert str(caught.value) == f"{bad}: truncated gzip file (it ends before its end marker)"
    with pytest.raises(TracekitError, match="no trace files"):
        read_traces([])


def test_small_inputs_parse_without_a_pool() -> None:
    assert _default_workers(TRACE_FILTER) == 1  # 0.24 MB: starting workers would cost more
    assert _default_workers([NCCL_DATA]) == 1


@pytest.mark.corpus
def test_trace_info_is_plain_data() -> None:
    info, _ = read_trace(CPU_ONLY)
    assert isinstance(info, TraceInfo) and isinstance(info.path, Path)
    assert isinstance(info.pg_config, tuple) and isinstance(info.warnings, tuple)


# --- property: damaged real traces never raise anything but TracekitError ---------------------


@pytest.mark.corpus
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_traces_parse_or_raise_tracekit_error(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    seed = data.draw(st.sampled_from(SEEDS))
    blob = data.draw(damaged(seed))
    path = tmp_path_factory.getbasetemp() / "damaged.rank2.json"
    path.write_bytes(blob)
    try:
        info, frame = read_trace(path)
    except TracekitError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    check_frame(frame)
    assert isinstance(info, TraceInfo) and all(isinstance(w, str) for w in info.warnings)
    assert frame["rank"].is_in([info.rank]).all()
    assert not any(math.isnan(x) for x in frame["start_ns"].cast(pl.Float64))


def test_every_source_maps_its_op_names_onto_the_one_list() -> None:
    """The profiler's, the flight recorder's and NCCL's op names all land on labels.COMM_OPS."""
    from tracekit.ingest import collectives, flight_recorder, nccl_lines
    from tracekit.labels import COMM_OPS

    for names in (collectives._OP_NAMES, flight_recorder._OP_NAMES, nccl_lines.OPS):
        assert set(names.values()) <= set(COMM_OPS), set(names.values()) - set(COMM_OPS)
