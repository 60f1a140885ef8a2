"""The Dask engine on a real cluster: a ``dask scheduler`` and two ``dask worker`` processes.

The fixture starts them on 127.0.0.1 (ports chosen by the OS: the scheduler writes its address
to a scheduler file, the workers read it there; no dashboards), one thread per worker, waits
until both workers are registered, and kills every process group at the end (the workers also
leave by themselves once the scheduler is gone: ``--death-timeout``).

The job: 16 ranks, renumbered copies of the dp sample's two real gloo ranks
(benchmarks/renumber.py). Checked: the per-rank tasks through the cluster give exactly the
in-process parse, and the scheduler's own task stream says both workers ran them; a worker
killed while it holds a task leaves the analysis to complete (Dask reruns the task) or to fail
with one line, within a bound; an unreachable scheduler and a missing Dask are one line each.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, run_cli

from tracekit.engines import open_executor
from tracekit.errors import TracekitError
from tracekit.ingest.kineto import parse_ranks, read_trace
from tracekit.summary import encode, from_json
from tracekit.summary.schema import Engine

try:
    import distributed
except ImportError:  # the cluster (or test) extra is not installed: only the missing-Dask test runs
    distributed = None
needs_dask = pytest.mark.skipif(distributed is None, reason="pip install -e '.[cluster]'")

# the builder by its path (benchmarks/ is not a package, nor on sys.path)
_SPEC = importlib.util.spec_from_file_location("renumber", ROOT / "benchmarks" / "renumber.py")
renumber = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(renumber)

RANKS = 16
START_S = 180  # a loaded 2-core machine starts three interpreters importing distributed slowly
BOUND_S = 300  # an analysis that has not finished by then hangs


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[Path]:
    sources = sorted((SAMPLES / "dp" / "traces").glob("rank*.json.gz"))
    return renumber.build(sources, RANKS, tmp_path_factory.mktemp("job16"))


@pytest.fixture(scope="module")
def in_process(job, tmp_path_factory) -> bytes:
    """summary.json of the job analysed without a scheduler, as the CLI writes it."""
    out = tmp_path_factory.mktemp("in_process") / "out"
    done = run_cli("analyze", str(job[0].parent), "--no-cache", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return (out / "summary.json").read_bytes()


def _without_engine(summary_json: bytes) -> tuple[bytes, dict | None]:
    """(summary.json as it would be without the ``engine`` key, that key's value)."""
    summary = json.loads(summary_json)
    engine = summary.pop("engine", None)
    return (json.dumps(summary, indent=2) + "\n").encode(), engine


@dataclass
class Cluster:
    address: str
    client: object  # a distributed.Client of the test's own, to ask the scheduler
    folder: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``dask scheduler`` (NAME "scheduler") or ``dask worker`` with ARGS, in a process group
        of its own, logging to FOLDER/NAME.log (ENV: its environment, default the cluster's)."""
        module = "dask_scheduler" if name == "scheduler" else "dask_worker"
        with open(self.folder / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"distributed.cli.{module}", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env or self.env,
                cwd=self.folder,
                start_new_session=True,  # its own group: the nanny's worker dies with it
            )
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self.start(
            name,
            *("--scheduler-file", str(self.folder / "scheduler.json")),
            *("--host", "127.0.0.1", "--nthreads", "1", "--no-dashboard", "--name", name),
            *("--local-directory", str(self.folder / name), "--death-timeout", "60"),
            env=env,
        )

    def worker_address(self, name: str) -> str:
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return next(addr for addr, w in info.items() if w["name"] == name)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
            for p in sorted(self.folder.glob("*.log"))
        )

    def stop(self, name: str) -> None:
        """Kill the process group of NAME (TERM; KILL whatever is left after 10 s), reap it."""
        proc = self.procs[name]
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("dask")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEKIT_", "DASK_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(":"))
    c = Cluster(address="", client=None, folder=folder, env=env)
    try:
        c.start(
            "scheduler",
            *("--host", "127.0.0.1", "--port", "0", "--no-dashboard"),
            *("--scheduler-file", str(folder / "scheduler.json"), "--idle-timeout", "600"),
        )
        for name in ("w1", "w2"):
            c.start_worker(name)
        deadline = time.monotonic() + START_S
        while not (folder / "scheduler.json").is_file():
            assert time.monotonic() < deadline, c.logs()
            assert c.procs["scheduler"].poll() is None, c.logs()
            time.sleep(0.2)
        c.client = distributed.Client(
            scheduler_file=str(folder / "scheduler.json"), timeout=60, set_as_default=False
        )
        c.address = c.client.scheduler.address
        c.client.wait_for_workers(2, timeout=max(1.0, deadline - time.monotonic()))
        yield c
    finally:
        if c.client is not None:
            c.client.close(timeout=30)
        for name in list(c.procs)[::-1]:
            c.stop(name)


def _pg_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group PGID, from /proc: an orphan's zombie waits
    for its reaper (PID 1, which in some containers never reaps), and killpg(pgid, 0) counts it."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == pgid:
            live.append(int(stat.parent.name))
    return live


def _pg_alive(pgid: int, within_s: float = 10.0) -> bool:
    """A live process of PGID is still there after WITHIN_S (a SIGKILL takes a moment)."""
    deadline = time.monotonic() + within_s
    while _pg_members(pgid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


# --- the real cluster --------------------------------------------------------------------------


@needs_dask
def test_per_rank_tasks_on_dask_equal_the_in_process_parse(cluster, job):
    expected = [read_trace(p) for p in job]
    with distributed.get_task_stream(client=cluster.client) as stream:
        with open_executor(cluster.address) as (executor, info):
            got = parse_ranks(executor, job)
    assert info == Engine("dask", cluster.address, 2)
    assert [i.rank for i, _ in got] == list(range(RANKS))
    for (want_info, want_frame), (got_info, got_frame) in zip(expected, got):
        assert got_info == want_info  # every TraceInfo field
        assert got_frame.schema == want_frame.schema
        assert got_frame.equals(want_frame)
    # the scheduler's record of what ran where (not ours): 16 parse_rank tasks, both workers
    ran = [t for t in stream.data if str(t["key"]).startswith("parse_rank-")]
    assert len(ran) == RANKS, stream.data
    workers = {cluster.worker_address("w1"), cluster.worker_address("w2")}
    assert {t["worker"] for t in ran} == workers
    assert all(t["status"] == "OK" for t in ran)


@needs_dask
def test_analyze_on_dask_writes_the_in_process_summary(cluster, job, in_process, tmp_path):
    out = tmp_path / "out"
    with distributed.get_task_stream(client=cluster.client) as stream:
        done = run_cli(
            "analyze", str(job[0].parent), "--no-cache", "--scheduler", cluster.address,
            "--out", str(out), timeout=BOUND_S,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the scheduler's record: both per-rank steps ran on the workers, one task per rank each
    # (the read, scan_file; the timeline step, map_ranks), on both workers
    workers = {cluster.worker_address("w1"), cluster.worker_address("w2")}
    for step in ("scan_file-", "map_ranks-"):
        ran = [t for t in stream.data if str(t["key"]).startswith(step)]
        assert len(ran) == RANKS, (step, len(ran))
        assert {t["worker"] for t in ran} == workers and all(t["status"] == "OK" for t in ran)
    written = (out / "summary.json").read_bytes()
    summary, engine = _without_engine(written)
    assert engine == {"kind": "dask", "address": cluster.address, "workers": 2}
    assert summary == in_process  # byte for byte, but for the engine
    assert encode(from_json(written)).encode() == written  # the schema knows the engine key


@needs_dask
def test_a_task_error_on_a_worker_is_the_users_one_line(cluster, tmp_path):
    bad = tmp_path / "rank3.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(TracekitError) as err:
        with open_executor(cluster.address) as (executor, _):
            parse_ranks(executor, [bad])
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


@needs_dask
def test_a_worker_killed_mid_analysis_never_hangs(cluster, job, in_process, tmp_path):
    """A third worker joins, and is killed (its whole process group) once the scheduler has
    given it a per-rank task; the two others must finish the job, or it fails in one line."""
    victim = cluster.start_worker("victim")
    cluster.client.wait_for_workers(3, timeout=START_S)
    victim_addr = cluster.worker_address("victim")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli", "analyze", str(job[0].parent)]
        + ["--no-cache", "--scheduler", cluster.address, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + BOUND_S
        while not any(
            str(k).startswith(("scan_file-", "map_ranks-"))
            for k in cluster.client.processing(workers=[victim_addr]).get(victim_addr, ())
        ):
            assert proc.poll() is None, (
                "finished before the victim got a task: " + proc.stderr.read()
            )
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.02)
        os.killpg(victim.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=BOUND_S)  # TimeoutExpired: it hung
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.stop("victim")
    assert not _pg_alive(victim.pid)
    if proc.returncode == 0:  # Dask ran the victim's task again on a worker left
        assert _without_engine((out / "summary.json").read_bytes())[0] == in_process
    else:  # Dask gave up on the task: one line, ours
        lines = stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("tracekit: "), (
            stderr
        )


@needs_dask
def test_a_worker_with_another_tracekit_is_one_line_before_any_task(cluster, job, tmp_path):
    """Tasks travel by reference: a worker importing another tracekit would run other code. A
    real worker whose tracekit says another version is named in one line, and nothing runs."""
    fake = tmp_path / "site" / "tracekit"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.0.1"\n')
    env = dict(cluster.env, PYTHONPATH=str(fake.parent))
    cluster.start_worker("old", env=env)
    cluster.client.wait_for_workers(3, timeout=START_S)
    try:
        out = tmp_path / "out"
        done = run_cli(
            "analyze", str(job[0].parent), "--no-cache", "--scheduler", cluster.address,
            "--out", str(out), timeout=BOUND_S,
        )  # fmt: skip
    finally:
        cluster.stop("old")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "tracekit 0.0.1" in lines[0] and "same version on every worker" in lines[0]
    assert not out.exists()
    deadline = time.monotonic() + START_S  # the scheduler forgets it before the next test
    while len(cluster.client.scheduler_info(n_workers=-1)["workers"]) > 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)


# --- no cluster needed --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_dask
def test_an_unreachable_scheduler_is_one_line_within_the_timeout(job):
    address = f"tcp://127.0.0.1:{_free_port()}"  # nobody listens there
    t0 = time.monotonic()
    with pytest.raises(TracekitError) as err:
        with open_executor(address, connect_timeout=2):
            pass
    assert time.monotonic() - t0 < 30
    assert str(err.value).startswith(f"cannot reach the Dask scheduler at {address}: ")
    assert "\n" not in str(err.value)


@needs_dask
def test_the_cli_reports_an_unreachable_scheduler_in_one_line(job, tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    out = tmp_path / "out"
    done = run_cli("analyze", str(job[0].parent), "--scheduler", address, "--out", str(out))
    assert time.monotonic() - t0 < 120  # the connect timeout is 10 s
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tracekit: cannot reach the Dask scheduler at {address}: ")
    assert not out.exists()


def test_a_missing_dask_says_how_to_get_it():
    code = (
        "import sys; sys.modules['distributed'] = None  # as if not installed\n"
        "from tracekit.engines import open_executor\n"
        "from tracekit.errors import TracekitError\n"
        "try:\n"
        "    with open_executor('tcp://127.0.0.1:8786'): pass\n"
        "except TracekitError as err: print(err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.stdout.strip().splitlines() == [
        "--scheduler tcp://127.0.0.1:8786 needs Dask distributed, which is not installed: "
        "pip install 'tracekit-dist[cluster]' (from a clone: pip install -e '.[cluster]')"
    ], done.stderr


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_local_engines_give_the_same_parse(kind, job):
    expected = [read_trace(p) for p in job[:3]]
    with open_executor(kind, workers=2) as (executor, info):
        got = parse_ranks(executor, job[:3])
    assert info == Engine(kind, None, 2)
    for (want_info, want_frame), (got_info, got_frame) in zip(expected, got):
        assert got_info == want_info and got_frame.equals(want_frame)


def test_the_environment_names_the_default_scheduler(monkeypatch):
    from tracekit.engines import resolve

    monkeypatch.setenv("TRACEKIT_SCHEDULER", "tcp://10.0.0.1:8786")
    assert resolve(None) == "tcp://10.0.0.1:8786"
    assert resolve("threads") == "threads"
    monkeypatch.setenv("TRACEKIT_SCHEDULER", " ")
    assert resolve(None) is None


@needs_dask
def test_a_relative_path_reaches_the_workers_absolute(cluster, job):
    """`tracekit analyze runs/<run> --scheduler ...` from the folder above the run: the workers
    run in a folder of their own (the fixture's), so the driver sends them absolute paths; the
    summary is the in-process one of the same relative path."""
    folder = job[0].parent
    summaries = []
    for name, scheduler in (("rel-dask", ["--scheduler", cluster.address]), ("rel-local", [])):
        done = run_cli(
            "analyze", folder.name, "--no-cache", *scheduler, "--out", name,
            cwd=folder.parent, timeout=BOUND_S,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        summaries.append(_without_engine((folder.parent / name / "summary.json").read_bytes()))
    (dask_summary, engine), (local_summary, _) = summaries
    assert engine is not None and engine["kind"] == "dask"
    assert dask_summary == local_summary
