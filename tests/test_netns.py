"""The emulated network: real namespaces, a real multi-node rendezvous, a shaped link, clean-up.

One 4-rank DP run on 2 emulated nodes at 400 mbit is shared by the measurement tests; the
clean-up tests start runs of their own and stop them with SIGTERM, SIGINT, SIGKILL (then the
next run's sweep) and a crashing rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit import runfolder
from tracekit.analysis import analyze
from tracekit.capture import netns
from tracekit.capture.launch import RunOptions, run_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable())),
]

REPO = Path(__file__).resolve().parents[1]
RATE = "400mbit"
STEPS = 2


def _ours(pid: int) -> list[str]:
    return [n for n in netns.our_namespaces() if n.startswith(f"tk{pid}")]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return [p for p in found if p != os.getpid()]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = run_job(
        RunOptions(
            "dp",
            nproc=4,
            nodes=2,
            steps=STEPS,
            emulate_network=True,
            inter_node_bandwidth=RATE,
            out=tmp_path_factory.mktemp("net"),
        )
    )
    assert runfolder.load_run_json(run)["status"] == "ok", runfolder.load_run_json(run)["errors"]
    return run


@pytest.fixture(scope="module")
def emulated_analysis(emulated: Path):
    return analyze(emulated)


def test_run_on_emulated_nodes_and_namespaces_gone(emulated: Path) -> None:
    data = runfolder.load_run_json(emulated)
    net = data["launch"]["network"]
    assert [n["address"] for n in net["nodes"]] == ["10.213.0.100", "10.213.0.101"]
    assert [t["node"] for t in data["topology"]] == [0, 0, 1, 1]  # the rendezvous kept placement
    assert [t["local_rank"] for t in data["topology"]] == [0, 1, 0, 1]
    names = {n["namespace"] for n in net["nodes"]}
    assert not names & set(netns.our_namespaces())
    assert not _processes_mentioning(str(emulated))
    for r in range(4):  # logs of both agents collected
        assert (emulated / "logs" / f"rank{r}.stderr.log").is_file()


def test_ring_all_reduce_half_inter_node(emulated_analysis) -> None:
    tr = emulated_analysis.summary.traffic
    assert tr.inter_node_fraction == 0.5  # ring 0->1->2->3->0: 1->2, 3->0 cross
    assert tr.intra_node_bytes + tr.inter_node_bytes == tr.total_bytes
    calls = emulated_analysis.frames["collective_matches"].unique("call_id")
    assert tr.total_bytes == pytest.approx(
        sum(2 * 3 / 4 * b * 4 for b in calls["bytes"]), abs=len(calls)
    )
    links = {
        (r["src"], r["dst"]): r["intra"]
        for r in emulated_analysis.frames["traffic_links"].to_dicts()
    }
    assert links == {(0, 1): True, (1, 2): False, (2, 3): True, (3, 0): False}


def test_communication_time_follows_the_shaped_bandwidth(emulated_analysis) -> None:
    """Inter-node bytes / bandwidth predicts the measured transfer time within a factor 2."""
    s = emulated_analysis.summary
    steps = s.window.steps
    predicted = s.traffic.per_step.inter_node_bytes * 8 / netns.rate_bits(RATE)
    calls = emulated_analysis.frames["collective_matches"].unique("call_id")
    transfer = calls["transfer_ns"].sum() * 1e-9 / steps
    comm = sorted(r.comm_s / steps for r in s.ranks)
    note = (
        f"inter-node bytes/step {s.traffic.per_step.inter_node_bytes:.0f}, predicted "
        f"{predicted:.3f} s/step at {RATE}; measured transfer {transfer:.3f} s/step, comm per rank {comm}"
    )
    print(note)
    assert predicted / 2 <= transfer <= 2 * predicted, note


def test_refused_without_iproute2(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/nonexistent")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracekit.cli",
            "run",
            "dp",
            "--nproc",
            "2",
            "--nodes",
            "2",
            "--emulate-network",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "iproute2" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing half-written


def _start(tmp_path: Path, steps: int = 100) -> tuple[subprocess.Popen, Path]:
    """A long emulated run, returned once its ranks have formed their process group."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracekit.cli",
            "run",
            "dp",
            "--nproc",
            "4",
            "--nodes",
            "2",
            "--emulate-network",
            "--inter-node-bandwidth",
            RATE,
            "--steps",
            str(steps),
            "--out",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        runs = list(tmp_path.glob("dp-*"))
        log = runs[0] / "logs" / "launcher.log" if runs else None
        if log is not None and log.is_file() and "[dp] 4 ranks" in log.read_text(errors="replace"):
            assert len(_ours(proc.pid)) == 3  # hub + 2 nodes while it runs
            return proc, runs[0]
        assert proc.poll() is None, "the run ended before it was interrupted"
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the emulated run did not start in time")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_launcher_removes_everything(tmp_path: Path, sig: int) -> None:
    proc, run = _start(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 130
    assert _ours(proc.pid) == []
    assert _processes_mentioning(str(run)) == []
    data = runfolder.load_run_json(run)
    assert data["status"] == "interrupted" and data["errors"][0]["kind"] == "interrupted"


def test_killed_launcher_is_swept(tmp_path: Path) -> None:
    proc, run = _start(tmp_path)
    proc.kill()  # no handler, no finally
    proc.wait(timeout=30)
    assert len(_ours(proc.pid)) == 3  # left behind ...
    swept = netns.sweep()  # ... until the next run sweeps
    assert set(_ours(proc.pid)) == set() and {f"tk{proc.pid}h"} <= set(swept)
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(0.2)  # ranks outside the namespaces die with their peers
    assert _processes_mentioning(str(run)) == []


def test_crashing_rank_fails_the_run_and_removes_the_network(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEKIT_FAIL_RANK", "3")
        run = run_job(
            RunOptions(
                "dp",
                nproc=4,
                nodes=2,
                steps=1,
                warmup=0,
                emulate_network=True,
                inter_node_bandwidth=RATE,
                out=tmp_path,
                timeout=400,
            )
        )
    data = runfolder.load_run_json(run)
    assert data["status"] == "failed"
    assert data["errors"][0]["rank"] == 3 and "injected failure" in data["errors"][0]["message"]
    assert _ours(os.getpid()) == []
    assert _processes_mentioning(str(run)) == []
