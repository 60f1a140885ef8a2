"""tracekit.profile on a user's own job: real 2-rank gloo scripts under torchrun and under a
simulated srun (SLURM_* variables, no torchrun), then `tracekit analyze` on what they wrote."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, torchrun

import tracekit
from tracekit import runfolder
from tracekit.analysis import analyze

USER_JOB = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    import tracekit

    def main(out):
        out = Path(out)
        if "SLURM_PROCID" in os.environ:     # srun: the script reads Slurm's variables itself
            dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]),
                                    world_size=int(os.environ["SLURM_NTASKS"]))
        else:                                # torchrun
            dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def train_step():
            loss = model(torch.randn(16, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            return loss.item()

        runs = {}
        # 1. the context manager: wait 1, warm-up 1, active 3
        with tracekit.profile(out / "ctx", wait=1, warmup=1, active=3) as prof:
            for _ in range(6):
                train_step()
                prof.step()
        runs["ctx"] = str(prof.run_dir)
        if os.environ.get("ONLY_CTX"):
            if dist.get_rank() == 0:   # one line: two ranks' writes to one pipe can interleave
                print("RUNS " + json.dumps(runs), flush=True)
            return
        # 2. the decorator around a train-step function, run folder given explicitly
        step = tracekit.profiled(run_dir=out / "deco", wait=0, warmup=1, active=2)(train_step)
        for _ in range(5):
            step()
        runs["deco"] = str(step.profiler.run_dir)
        # 3. a Hugging Face style callback, two profiling cycles
        cb = tracekit.StepProfiler(out / "cb", wait=1, warmup=0, active=2, repeat=2)
        cb.on_init_end(None, None, None)
        cb.on_train_begin(None, None, None)
        for _ in range(7):
            cb.on_step_begin(None, None, None)
            train_step()
            cb.on_step_end(None, None, None)
        cb.on_train_end(None, None, None)
        runs["cb"] = str(cb.run_dir)
        if dist.get_rank() == 0:
            print("RUNS " + json.dumps(runs), flush=True)
        dist.destroy_process_group()

    if __name__ == "__main__":
        main(sys.argv[1])
""")


def _runs_from(stdout: str) -> dict[str, Path]:
    lines = [l for l in stdout.splitlines() if l.startswith("RUNS ")]
    assert lines, stdout[-2000:]
    return {k: Path(v) for k, v in json.loads(lines[0][5:]).items()}


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("user_job")
    script = root / "train.py"
    script.write_text(USER_JOB)
    proc = torchrun(script, root / "out", cwd=root, one_thread=False)  # torchrun's threads
    return _runs_from(proc.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def srun_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], list[str]]:
    """Two processes started as srun starts tasks: SLURM_* set, MASTER_ADDR/PORT, no torchrun;
    each task claims its own node (SLURM_NODEID) although both run here."""
    root = tmp_path_factory.mktemp("srun_job")
    script = root / "train.py"
    script.write_text(USER_JOB)
    port = _free_port()
    ncpu = len(os.sched_getaffinity(0))
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "GROUP_", "LOCAL_", "RANK", "WORLD_"))
    }
    procs = []
    for task in (0, 1):
        env = {
            **base,
            "PYTHONPATH": str(ROOT),
            "SLURM_PROCID": str(task),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(task),
            "SLURM_JOB_ID": "4242",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "ONLY_CTX": "1",
            "OMP_NUM_THREADS": str(ncpu),
        }  # every task takes every CPU: oversubscribed
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(root / "out")],
                env=env,
                cwd=root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    return _runs_from(outs[0][0]), [err for _, err in outs]


# --- torchrun ------------------------------------------------------------------------------------


def test_run_json_of_a_torchrun_job(torchrun_job: dict[str, Path]) -> None:
    run = torchrun_job["ctx"]
    assert run.parent.name == "ctx" and run.name.startswith("user-")
    data = runfolder.load_run_json(run)
    assert (data["strategy"], data["world_size"], data["backend"], data["device"]) == (
        "user",
        2,
        "gloo",
        "cpu",
    )
    assert {k: data["config"][k] for k in ("wait", "warmup", "active", "repeat")} == {
        "wait": 1,
        "warmup": 1,
        "active": 3,
        "repeat": 1,
    }
    assert data["status"] == "ok" and data["errors"] == [] and data["launcher"] == "torchrun"
    host = socket.gethostname()
    assert data["topology"] == [
        {"rank": 0, "node": 0, "host": host, "local_rank": 0},
        {"rank": 1, "node": 0, "host": host, "local_rank": 1},
    ]
    assert data["topology_source"] == "GROUP_RANK"
    assert data["versions"]["torch"] and data["versions"]["tracekit"] == tracekit.__version__
    env = data["environment"]
    assert env["cpu_model"] is not None and env["threads_by_rank"] == [1, 1]
    assert env["variables"]["OMP_NUM_THREADS"] == "1"  # torchrun's, recorded
    if len(os.sched_getaffinity(0)) >= 2:  # 2 ranks x 1 thread fit
        assert not any("oversubscribe" in w for w in data["warnings"])
    for r in (0, 1):
        assert runfolder.trace_path(run, r).is_file()
        assert (runfolder.nccl_dir(run) / f"fr_rank{r}.json").is_file()  # flight recorder, gloo too
    assert not [p for p in run.rglob(".*")], "no temporary or lock files left"


def test_tracekit_analyze_reads_the_run_folder(
    torchrun_job: dict[str, Path], tmp_path: Path
) -> None:
    proc = run_cli("analyze", str(torchrun_job["ctx"]), "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert (
        summary["window"]["kind"] == "complete_steps" and summary["window"]["steps"] == 3
    )  # == active
    assert summary["topology"] == {"source": "run.json", "nodes": {"0": 0, "1": 0}}
    assert summary["run"]["strategy"] == "user" and summary["run"]["status"] == "ok"
    assert summary["collectives"]["count"] > 0
    # the ranks' CPU wait was recorded over the traced steps (contention/rank<R>.json): its wall
    # time is that of the trace's three steps (ProfilerStep spans, an independent clock)
    cont = summary["contention"]
    assert cont is not None and cont["ranks"] == 2 and cont["corun_slowdown_max"] is not None
    steps_s = {r["rank"]: r["span_s"] for r in summary["ranks"]}
    for row in cont["per_rank"]:
        assert row["wall_s"] == pytest.approx(steps_s[row["rank"]], rel=0.2, abs=0.01), (
            row,
            steps_s,
        )
        assert row["cpu_wait_s"] is not None and row["cpu_wait_s"] <= row["wall_s"]
    # nothing is missing from our own traces, so nothing is said to be
    assert not [w for w in summary["warnings"] if " no trace" in w or w.startswith("no ")], summary[
        "warnings"
    ]


def _step_names(trace: Path) -> tuple[str, ...]:
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return tuple(
        sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    )


def test_decorator_and_callback_forms(torchrun_job: dict[str, Path]) -> None:
    deco = torchrun_job["deco"]
    assert deco.name == "deco"  # run_dir= is the run folder itself
    data = runfolder.load_run_json(deco)
    assert data["status"] == "ok" and data["config"]["active"] == 2 and data["steps_taken"] == 3
    result = analyze(deco)
    assert result.summary.window.steps == 2 and [r.rank for r in result.summary.ranks] == [0, 1]
    # the callback ran two cycles (wait 1 + active 2, twice): the latest is the trace, the first kept aside
    cb = torchrun_job["cb"]
    data = runfolder.load_run_json(cb)
    assert (
        data["status"] == "ok" and data["cycles"] == 2 and data["steps_taken"] == 6
    )  # stopped itself
    for r in (0, 1):  # the contention file holds the steps of the trace kept: 4 and 5
        kept = json.loads((cb / "contention" / f"rank{r}.json").read_text())
        assert [s["step"] for s in kept["steps"]] == [4, 5], kept["steps"]
        older = cb / "traces" / "cycles" / f"rank{r}.cycle1.json.gz"
        assert older.is_file() and runfolder.trace_path(cb, r).is_file()
        steps = {_step_names(p) for p in (older, runfolder.trace_path(cb, r))}
        assert steps == {("ProfilerStep#1", "ProfilerStep#2"), ("ProfilerStep#4", "ProfilerStep#5")}
    assert analyze(cb).summary.window.steps == 2


# --- srun ----------------------------------------------------------------------------------------


def test_srun_topology_from_slurm_variables(
    srun_job: tuple[dict[str, Path], list[str]], tmp_path: Path
) -> None:
    runs, stderrs = srun_job
    data = runfolder.load_run_json(runs["ctx"])
    host = socket.gethostname()
    assert data["launcher"] == "slurm" and data["topology_source"] == "SLURM_NODEID"
    assert data["topology"] == [
        {"rank": 0, "node": 0, "host": host, "local_rank": 0},
        {"rank": 1, "node": 1, "host": host, "local_rank": 0},
    ]
    # every task runs one thread per CPU: the host is oversubscribed, and the user is told
    over = [w for w in data["warnings"] if "oversubscribe" in w]
    assert len(over) == 1 and f"host {host}: 2 ranks" in over[0] and "set_num_threads" in over[0]
    assert all("ProfileWarning" in err and "oversubscribe" in err for err in stderrs)
    proc = run_cli("analyze", str(runs["ctx"]), "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["topology"]["nodes"] == {"0": 0, "1": 1} and summary["window"]["steps"] == 3


# --- one process, no torch.distributed -----------------------------------------------------------


def _tiny_steps(prof: tracekit.Profiler, n: int) -> None:
    import torch

    model = torch.nn.Linear(32, 32)
    for _ in range(n):
        model(torch.randn(4, 32)).sum().backward()
        prof.step()


def test_one_rank_without_distributed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")  # a launcher said 4 ranks, but nobody initialised
    log = tmp_path / "nccl-logs" / "%h.%p.log"
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(log))
    expanded = Path(
        str(log).replace("%h", socket.gethostname().split(".")[0]).replace("%p", str(os.getpid()))
    )
    expanded.parent.mkdir()
    expanded.write_text(
        "vm:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0\n"
    )
    with pytest.warns(tracekit.ProfileWarning, match="not initialised"):
        with tracekit.profile(tmp_path, wait=0, warmup=1, active=2) as prof:
            _tiny_steps(prof, 3)
    data = runfolder.load_run_json(prof.run_dir)
    assert (data["world_size"], data["backend"], data["status"]) == (1, None, "ok")
    assert data["topology"] == [
        {"rank": 0, "node": 0, "host": socket.gethostname(), "local_rank": 0}
    ]
    assert any("not initialised" in w for w in data["warnings"])
    assert (runfolder.nccl_dir(prof.run_dir) / expanded.name).read_text() == expanded.read_text()
    result = analyze(prof.run_dir)
    assert result.summary.window.steps == 2 and result.summary.ranks[0].rank == 0


def test_an_exception_in_the_block_is_recorded(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError):
        with tracekit.profile(tmp_path, wait=0, warmup=1, active=5) as prof:
            _tiny_steps(prof, 3)
            _ = 1 / 0
    data = runfolder.load_run_json(prof.run_dir)
    assert data["status"] == "failed"
    assert data["errors"] == [
        {"rank": 0, "kind": "exception", "message": "ZeroDivisionError: division by zero"}
    ]
    assert runfolder.trace_path(prof.run_dir, 0).is_file()  # what was recorded is kept
    assert analyze(prof.run_dir).summary.window.steps >= 1


def test_short_loop_and_bad_schedule(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tracekit.profile(tmp_path, wait=1, warmup=1, active=3) as prof:
            _tiny_steps(prof, 1)  # stops in the warm-up step: no trace
    data = runfolder.load_run_json(prof.run_dir)
    assert data["status"] == "ok" and any("only 1 step taken" in w for w in data["warnings"])
    assert any("ranks [0] wrote no trace" in w for w in data["warnings"])
    assert any("only 1 step taken" in str(w.message) for w in caught)
    proc = run_cli("analyze", str(prof.run_dir))
    assert (
        proc.returncode == 2
        and "no rank wrote one" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    with pytest.raises(ValueError):
        tracekit.profile(tmp_path, active=0)
    with pytest.raises(RuntimeError):
        tracekit.profile(tmp_path).step()
