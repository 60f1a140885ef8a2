"""Traces users bring: HTA's real GPU/CPU traces, a single-rank trace, a rank missing from a set,
profiling cycles written by tensorboard_trace_handler (a real 2-rank gloo job with repeat=2),
two traces claiming one rank, mixed jobs, and hosts with skewed clocks (copies of our sample
traces rewritten)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import polars as pl
import pytest
from builders.corpus_root import HTA_FOLDERS
from builders.traces import read_gz, write_trace
from conftest import HTA, SAMPLES, run_cli, torchrun

from tracekit.analysis import analyze
from tracekit.errors import TracekitError
from tracekit.ingest import read_traces
from tracekit.runfolder import find_trace_files

pytestmark = pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")

DP = SAMPLES / "dp" / "traces"

TB_JOB = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1], use_gzip=True)) as prof:
        for _ in range(4):
            model(torch.randn(8, 64)).sum().backward()
            dist.all_reduce(model.weight.grad)
            prof.step()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def cycles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four real files <host>_<pid>.<ns>.pt.trace.json.gz: two cycles of each of two ranks."""
    root = tmp_path_factory.mktemp("tb")
    (root / "job.py").write_text(TB_JOB)
    torchrun(root / "job.py", root / "traces", cwd=root)
    files = sorted((root / "traces").glob("*.pt.trace.json.gz"))
    assert len(files) == 4
    return root / "traces"


def warned(result, *needles: str) -> list[str]:
    hits = [w for w in result.summary.warnings if all(n in w for n in needles)]
    assert hits, (needles, result.summary.warnings)
    return hits


# --- HTA's folders: use what is there, say what is missing ------------------------------------


@pytest.mark.corpus
@pytest.mark.parametrize(
    "folder, needles",
    [
        ("trace_filter", ["ranks 2-127 of world size 128 (distributedInfo) have no trace"]),
        ("nccl_parser_config", ["rank 1 of world size 2 (distributedInfo) has no trace"]),
        ("critical_path/alexnet", ["no ProfilerStep markers in benchmark_result", "whole trace"]),
        (
            "amd_trace",
            ["no distributedInfo in mi250_minitoy", "world size and process groups unknown"],
        ),
        ("distributed_info_unavailable", ["no distributedInfo in distributed_info_not_found"]),
        ("cpu_only", ["no record_param_comms in rank-34", "process groups unknown"]),
        (
            "rank_unavailable",
            [
                "no rank in distributedInfo or file name; taken as rank 0",
                "no distributedInfo in rank_not_found.json.gz",
            ],
        ),
    ],
)
def test_hta_folders_say_what_is_missing(folder: str, needles: list[str]) -> None:
    result = analyze(HTA / folder)
    assert result.summary.ranks
    for needle in needles:
        warned(result, needle)
    assert all("\n" not in w for w in result.summary.warnings)


@pytest.mark.corpus
def test_every_hta_folder_is_covered(tmp_path: Path) -> None:
    covered = {
        "trace_filter",
        "nccl_parser_config",
        "critical_path/alexnet",
        "amd_trace",
        "distributed_info_unavailable",
        "cpu_only",
        "rank_unavailable",
    }
    assert set(HTA_FOLDERS) == covered and all((HTA / f).is_dir() for f in covered)
    # all of them at once: unrelated single traces, several without a rank: a clear refusal
    together = tmp_path / "hta"
    for f in covered:
        shutil.copytree(HTA / f, together / f)
    with pytest.raises(TracekitError, match="no rank in distributedInfo or file name, and several"):
        analyze(together)


@pytest.mark.corpus
def test_hta_trace_filter_through_the_cli(tmp_path: Path) -> None:
    proc = run_cli("analyze", str(HTA / "trace_filter"), "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert any("ranks 2-127 of world size 128" in w for w in summary["warnings"])
    assert "ranks 2-127 of world size 128" in proc.stderr


# --- single rank, missing rank -----------------------------------------------------------------


def test_single_rank_trace_of_a_plain_process(tmp_path: Path) -> None:
    """A trace of a process without torch.distributed: no distributedInfo, no rank in the name."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    trace = tmp_path / "my_job.pt.trace.json"
    model = torch.nn.Linear(32, 32)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=2),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as prof:
        for _ in range(3):
            model(torch.randn(4, 32)).sum().backward()
            prof.step()
    result = analyze(trace)
    assert [r.rank for r in result.summary.ranks] == [0]
    assert result.summary.window.steps == 2
    warned(result, "no rank in distributedInfo or file name; taken as rank 0")
    warned(result, "no distributedInfo in my_job.pt.trace.json")
    assert not [w for w in result.summary.warnings if "have no trace" in w or "has no trace" in w]


def test_rank_missing_from_a_set(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(DP / "rank1.json.gz", folder / "rank1.json.gz")
    proc = run_cli("analyze", str(folder))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((folder / "analysis" / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [1]
    assert (
        "rank 0 of world size 2 (distributedInfo) has no trace: the analysis covers rank 1 only"
        in summary["warnings"]
    )
    # in a run folder the world size comes from run.json
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "dp", run, ignore=shutil.ignore_patterns("analysis"))
    (run / "traces" / "rank0.json.gz").unlink()
    result = analyze(run)
    warned(result, "rank 0 of world size 2 (run.json) has no trace")


# --- several profiling cycles of one rank -------------------------------------------------------


def test_profiling_cycles_take_the_latest(cycles: Path, tmp_path: Path) -> None:
    files = sorted(cycles.iterdir())
    assert all("rank" not in f.name for f in files)  # <host>_<pid>.<ns>: the rank is inside
    result = analyze(cycles)
    assert [r.rank for r in result.summary.ranks] == [0, 1]
    assert result.summary.window.steps == 1
    steps = result.events.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert set(steps["name"]) == {"ProfilerStep#3"}  # the second cycle on both ranks
    notes = warned(
        result, "traces of rank", "from one process (profiling cycles): using the latest"
    )
    assert len(notes) == 2
    used = {i.path.name for i in result.infos}
    ignored = {f.name for f in files} - used
    assert len(ignored) == 2 and all(any(name in n for n in notes) for name in ignored)
    # --ranks works although the rank is only inside the files
    only = analyze(cycles, ranks=[1])
    assert [r.rank for r in only.summary.ranks] == [1]


def test_two_traces_claim_one_rank_at_the_same_time(tmp_path: Path) -> None:
    a = tmp_path / "a" / "rank0.json.gz"
    b = tmp_path / "b" / "copy_rank0.json.gz"
    for p in (a, b):
        p.parent.mkdir()
        shutil.copy(DP / "rank0.json.gz", p)
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("tracekit: ") and "\n" not in line
    assert (
        "rank 0 is claimed by" in line and str(a) in line and str(b) in line and "same time" in line
    )
    assert not (tmp_path / "analysis").exists()


# --- mixed jobs ---------------------------------------------------------------------------------


@pytest.mark.corpus
def test_mixed_world_sizes(tmp_path: Path) -> None:
    shutil.copy(DP / "rank1.json.gz", tmp_path / "rank1.json.gz")
    shutil.copy(
        HTA / "trace_filter" / "sampled_rank-0.json.gz", tmp_path / "sampled_rank-0.json.gz"
    )
    with pytest.raises(
        TracekitError, match="traces from different jobs: .* says world size"
    ) as err:
        analyze(tmp_path)
    assert "rank1.json.gz" in str(err.value) and "sampled_rank-0.json.gz" in str(err.value)


def test_one_rank_from_two_runs(tmp_path: Path, cycles: Path) -> None:
    shutil.copy(DP / "rank0.json.gz", tmp_path / "rank0.json.gz")
    for f in cycles.iterdir():
        shutil.copy(f, tmp_path / f.name)
    with pytest.raises(TracekitError, match="rank 0 has traces from different processes"):
        analyze(tmp_path)


def test_one_host_no_overlap_is_not_one_job(tmp_path: Path) -> None:
    """rank 1 of an hour later, same host: two runs that happen to make a full set."""
    write_trace(tmp_path / "rank0.json.gz", read_gz(DP / "rank0.json.gz"))
    later = read_gz(DP / "rank1.json.gz")
    later["baseTimeNanoseconds"] += 3600 * 10**9
    write_trace(tmp_path / "rank1.json.gz", later)
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rank0.json.gz and rank1.json.gz come from one host" in proc.stderr
    assert "do not overlap in time" in proc.stderr


# --- different hosts, skewed clocks -----------------------------------------------------------


def test_hosts_with_skewed_clocks(tmp_path: Path) -> None:
    """rank 1 'on another host' whose clock runs 3 s ahead: kept per file, analysed, no crash."""
    r0, r1 = read_gz(DP / "rank0.json.gz"), read_gz(DP / "rank1.json.gz")
    r0["host_name"], r1["host_name"] = "node-a", "node-b"
    r1["baseTimeNanoseconds"] += 3 * 10**9
    write_trace(tmp_path / "rank0.json.gz", r0)
    write_trace(tmp_path / "rank1.json.gz", r1)
    infos, _ = read_traces(find_trace_files(tmp_path), workers=1)
    assert [(i.host_name, i.base_ns) for i in infos] == [
        ("node-a", r0["baseTimeNanoseconds"]),
        ("node-b", r1["baseTimeNanoseconds"]),
    ]
    result = analyze(tmp_path)
    assert [r.rank for r in result.summary.ranks] == [0, 1]
    assert result.summary.topology.nodes == {"0": 0, "1": 1}
    for r in result.summary.ranks:
        assert r.span_s > 0 and r.comm_s > 0
