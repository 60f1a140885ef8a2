"""The launcher: option checks, failing ranks, timeouts, logical nodes (real gloo jobs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit import labels, runfolder
from tracekit.capture.launch import RunOptions, run_job
from tracekit.errors import TracekitError

REPO = Path(__file__).resolve().parents[1]


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (psutil-free: /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{entry.name}: {cmd}")
    return found


@pytest.mark.parametrize(
    "opts, words",
    [
        (RunOptions("dp", microbatches=4), "--microbatches"),
        (RunOptions("dp", prefetch=1), "--prefetch"),
        (RunOptions("dp", nproc=3, nodes=2), "divide"),
        (RunOptions("no-such-strategy"), "unknown strategy"),
        (RunOptions("dp", backend="nccl"), "nccl"),
        (RunOptions("dp", nproc=200, nodes=100, emulate_network=True), "at most 64"),
        (RunOptions("dp", nproc=65), "--nproc must be .* at most 64"),
        (RunOptions("pp-1f1b", nproc=3), "does not divide into 6 microbatches"),  # #24
        (RunOptions("pp-1f1b", nproc=2, microbatches=3), "does not divide into 3 microbatches"),
        (RunOptions("dp", nproc=3), "does not divide by 3 ranks"),
        (RunOptions("dp", precision="fp8"), "fp32 or bf16-mixed"),
        (RunOptions("dp", inter_node_bandwidth="fast"), "tc rate"),
        (RunOptions("hsdp", nproc=2, nodes=1), "--nodes K >= 2"),  # layouts: refused before launch
        (RunOptions("hsdp", nproc=2, nodes=2), "at least 2 ranks per node"),
        (RunOptions("pp-gpipe", nproc=5), "only 4 blocks"),
        (RunOptions("tp", nproc=8), "4 attention heads .* over 8 tensor-parallel ranks"),  # #24
        (RunOptions("tp-dp", nproc=8, nodes=1), "over 8 tensor-parallel ranks per node"),
    ],
)
def test_bad_options(tmp_path: Path, opts: RunOptions, words: str) -> None:
    opts.out = tmp_path / "runs"
    with pytest.raises(TracekitError, match=words) as err:
        run_job(opts)
    assert "\n" not in str(err.value)
    assert not opts.out.exists()  # nothing half-written


def test_cuda_without_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TracekitError, match="no usable GPU"):
        run_job(RunOptions("dp", device="cuda", out=tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_harness_rejects_unused_option() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "instrumented_runs.dp", "--microbatches", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--microbatches is not used by dp" in proc.stderr


@pytest.mark.slow
def test_failing_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_FAIL_RANK", "1")
    t0 = time.monotonic()
    run = run_job(RunOptions("dp", nproc=2, steps=2, out=tmp_path))
    assert time.monotonic() - t0 < 60
    data = runfolder.load_run_json(run)
    assert data["status"] == "failed"
    first = data["errors"][0]
    assert first["rank"] == 1 and first["kind"] == "exception" and first["root_cause"] is True
    assert "injected failure on rank 1" in first["message"]
    assert (run / "logs" / "rank1.error.json").is_file()
    assert not _processes_mentioning(str(run))


@pytest.mark.slow
def test_timeout_kills_the_job(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run = run_job(RunOptions("dp", nproc=2, steps=50, warmup=50, timeout=4, out=tmp_path))
    assert time.monotonic() - t0 < 30
    data = runfolder.load_run_json(run)
    assert data["status"] == "timeout"
    assert data["errors"][0]["kind"] == "timeout"
    assert not _processes_mentioning(str(run))


@pytest.mark.slow
def test_two_logical_nodes(tmp_path: Path) -> None:
    run = run_job(RunOptions("dp", nproc=2, nodes=2, steps=1, warmup=0, out=tmp_path))
    data = runfolder.load_run_json(run)
    assert data["status"] == "ok"
    assert [t["node"] for t in data["topology"]] == [0, 1]
    assert data["config"]["nodes"] == 2
    assert runfolder.trace_path(run, 1).is_file()


def test_label_scheme_round_trips() -> None:
    assert labels.all_reduce_bucket(3) == "comm:all_reduce:bucket3"
    assert labels.wait_bucket(3) == "comm:wait:bucket3"
    assert labels.all_gather_unit(2, "bwd") == "comm:all_gather:unit2:bwd"
    assert labels.reduce_scatter_unit(5) == "comm:reduce_scatter:unit5"
    assert labels.pipeline("F", 1, 4) == "F:s1:mb4"
    assert labels.pipeline("W", 0, 2, version=3) == "W:s0:mb2:v3"
    lab = labels.parse("comm:all_gather:unit2:fwd")
    assert (lab.family, lab.op, lab.what_kind, lab.index, lab.qualifiers) == (
        "comm",
        "all_gather",
        "unit",
        2,
        ("fwd",),
    )
    lab = labels.parse("B:s3:mb7:v1")
    assert (lab.family, lab.kind, lab.stage, lab.microbatch, lab.version) == (
        "pipeline",
        "B",
        3,
        7,
        1,
    )
    assert labels.parse("backward").phase == "backward"
    assert labels.parse("comm:wait:bucket0").op == "wait"
    for foreign in ("aten::mm", "ProfilerStep#2", "gloo:all_reduce", "comm:frobnicate:x", "F:s1"):
        assert labels.parse(foreign) is None
    with pytest.raises(ValueError):
        labels.comm("all_reduce", "bad:name")
