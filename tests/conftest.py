"""Shared test fixtures: paths to the real traces and the committed sample runs."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from builders import corpus_root
from builders.traces import HTA

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"


def _drop_root_read() -> None:
    """In the child before exec: root loses the capabilities that let it read or write any file
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so that file permissions apply as to a user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone after exec
            raise OSError(ctypes.get_errno(), "prctl")


def run_cli(
    *args: str,
    timeout: float = 300,
    cwd: Path | None = None,
    env: dict[str, str | None] | None = None,
    as_user: bool = False,
) -> subprocess.CompletedProcess:
    """`tracekit ARGS` in a subprocess, exactly as a user runs it. ``env``: variables set over
    this process's environment (None: removed); ``as_user``: as root, file permissions apply
    as to any user."""
    full = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=full,
        preexec_fn=_drop_root_read if as_user and os.geteuid() == 0 else None,
    )


def torchrun(
    *args: str | Path,
    nproc: int = 2,
    timeout: float = 300,
    cwd: Path | None = None,
    one_thread: bool = True,
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node NPROC ARGS`, the repository importable; every rank
    on one thread (OMP_NUM_THREADS=1; ``one_thread=False``: torchrun's own default). Fails the
    test with the job's output unless the job succeeds."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if not one_thread:
        del env["OMP_NUM_THREADS"]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        + ["--nproc-per-node", str(nproc), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def spy_parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """From now on in this test, every file ingest really parses (tracekit.ingest.kineto's
    read_trace: the cache and the rank selection exist to avoid those), in order."""
    from tracekit.ingest import kineto

    parsed: list[Path] = []
    real = kineto.read_trace

    def spy(path, rank=None):  # noqa: ANN001, ANN202 - read_trace's own signature
        parsed.append(Path(path))
        return real(path, rank)

    monkeypatch.setattr(kineto, "read_trace", spy)
    return parsed


@pytest.fixture(scope="session")
def hta() -> Path:
    return HTA


# --- the fast tier ------------------------------------------------------------------------------
# `pytest -m "not slow"` (make test-fast) starts no multi-process job and no browser. Tests that
# do are marked slow here, centrally: by module, by the fixture that starts the job (so a new
# test using it is slow without saying so), by name or by parameter; a module may also mark
# itself.
SLOW_MODULES = {
    "test_dash": "Chromium through Playwright",
    "test_dp": "tracekit run dp jobs",
    "test_failed_runs": "tracekit run jobs that crash, hang and time out",
    "test_fsdp": "tracekit run fsdp / hsdp jobs",
    "test_matching": "a torchrun job with several process groups",
    "test_netns": "emulated multi-node jobs",
    "test_pipeline_runs": "tracekit run pipeline jobs",
    "test_profile_api": "torchrun and srun-style 2-rank jobs",
    "test_tp": "tracekit run tp / tp-dp jobs",
    "test_zero": "tracekit run zero1-3 jobs",
    "test_why": "2-rank gloo jobs with a planted straggler",
    "test_straggler_validation": "tracekit run dp, fsdp, pp-1f1b with and without --straggler",
    "test_contention_runs": "a 2-rank dp job beside busy loops",
}
SLOW_FIXTURES = {  # "module::fixture" -> what it starts
    "test_dask::cluster": "a Dask scheduler and two workers",
    "test_demo::demo": "tracekit demo (four runs)",
    "test_flight_recorder::live_dir": "a 2-rank torchrun job",
    "test_foreign_traces::cycles": "a 2-rank torchrun job",
    "test_ingest::gloo_traces": "a 2-rank torchrun job",
    "test_overlap::fsdp2_traces": "a 2-rank torchrun FSDP2 job",
    "test_pipeline_analysis::torch_traces": "a 2-rank torch.distributed.pipelining job",
    "test_traffic_runs::two_nodes": "tracekit run hsdp / zero3 jobs on 4 ranks",
}
SLOW_TESTS = {  # "module::test" -> what it starts
    "test_no_harm::test_ctrl_c_stops_run": "tracekit run dp, stopped by Ctrl-C",
    "test_harm_oracle::test_harm_oracle_long": "60 drawn tracekit commands in decoy sandboxes",
    "test_harm_oracle_jobs::test_run_among_decoys": "tracekit run dp among decoys",
    "test_harm_oracle_jobs::test_demo_among_decoys": "tracekit demo --only dp among decoys",
    "test_harm_oracle_jobs::test_the_app_among_decoys": "the Dash app analysing two runs",
}
SLOW_PARAMS = {  # "module::parameter" -> {value: what it starts}
    "test_flight_recorder::records": {"live": "a 2-rank torchrun job (live_dir)"},
    "test_report::fmt": {"pdf": "Chromium (kaleido)", "png": "Chromium (kaleido)"},
}


def _slow_param(module: str, item: pytest.Item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name, value in params.items():
        why = (
            SLOW_PARAMS.get(f"{module}::{name}", {}).get(value) if isinstance(value, str) else None
        )
        if why:
            return why
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        why = (
            SLOW_MODULES.get(module)
            or SLOW_TESTS.get(f"{module}::{getattr(item, 'originalname', item.name)}")
            or _slow_param(module, item)
            or next(
                (
                    SLOW_FIXTURES[f"{module}::{f}"]
                    for f in getattr(item, "fixturenames", ())
                    if f"{module}::{f}" in SLOW_FIXTURES
                ),
                None,
            )
        )
        if why and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow(reason=why))


def _starts_job_or_browser(args: Any, env: dict | None) -> str | None:
    """What a process about to start is, when it is a multi-process job or a browser."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    argv = [os.fsdecode(a) for a in argv]
    names = [os.path.basename(a).lower() for a in argv]
    if "torch.distributed.run" in argv or "torchrun" in names:
        return "a torchrun job"
    if "tracekit.cli" in argv and argv[argv.index("tracekit.cli") + 1 :][:1] in (["run"], ["demo"]):
        return "tracekit run"
    if any(re.search(r"chrom(e|ium)", n) for n in names):
        return "a browser (Chromium)"
    if any("playwright" in a for a in argv[:2]):
        return "a browser (Playwright)"
    if env and any(env.get(k, "1") not in ("0", "1") for k in ("WORLD_SIZE", "SLURM_NTASKS")):
        return "a rank of a multi-process job (WORLD_SIZE / SLURM_NTASKS in its environment)"
    return None


_RUNNING: list[pytest.Item] = []  # the test whose setup, call or teardown runs now


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _RUNNING.append(item)
    try:
        yield
    finally:
        _RUNNING.remove(item)


def pytest_configure(config: pytest.Config) -> None:
    """Under -m "not slow", an unmarked test that starts a job or a browser fails, saying so."""
    if "not slow" not in (config.getoption("markexpr", "") or ""):
        return
    real = subprocess.Popen

    class FastTierPopen(real):  # observes only: every process still starts through Popen
        def __init__(self, args: Any, *rest: Any, **kw: Any) -> None:
            what = _starts_job_or_browser(args, kw.get("env"))
            test = _RUNNING[-1] if _RUNNING else None
            if what and test is not None and test.get_closest_marker("slow") is None:
                raise RuntimeError(
                    f"{test.nodeid} is not marked slow but starts {what}: add it to SLOW_MODULES, "
                    "SLOW_FIXTURES, SLOW_TESTS or SLOW_PARAMS in tests/conftest.py, or mark it slow"
                )
            super().__init__(args, *rest, **kw)

    subprocess.Popen = FastTierPopen
    config.add_cleanup(lambda: setattr(subprocess, "Popen", real))


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """Every test's cache entries go to a temporary folder, never the real ~/.cache/tracekit
    (subprocesses inherit it: run_cli copies the environment)."""
    folder = tmp_path_factory.mktemp("tracekit-cache")
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(folder))
    return folder


@contextlib.contextmanager
def serve_flask(flask_app):  # noqa: ANN001 - a Flask app (the Dash app's .server)
    """Serve a Flask app on a free 127.0.0.1 port in a thread; yields its base URL."""
    from werkzeug.serving import make_server

    srv = make_server("127.0.0.1", 0, flask_app, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        thread.join(timeout=10)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``corpus`` needs TRACEKIT_CORPUS; without it it skips before any fixture is
    set up, with the one reason tests/builders/corpus_root.py gives (the only skip the corpus causes)."""
    if item.get_closest_marker("corpus") is not None:
        corpus_root.require()


_CORPUS_OUTCOMES: dict[str, str] = {}  # test id of a corpus-marked test -> its outcome


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "corpus" in report.keywords and (report.when == "call" or report.outcome != "passed"):
        _CORPUS_OUTCOMES[report.nodeid] = report.outcome  # a setup skip or failure counts too


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line with the corpus' own count (issue #23: CI shows how many corpus cases passed)."""
    if not _CORPUS_OUTCOMES:
        return
    counts = {o: list(_CORPUS_OUTCOMES.values()).count(o) for o in ("passed", "failed", "skipped")}
    where = corpus_root.missing() or f"{corpus_root.ENV}={corpus_root.CORPUS}"
    cases = sum(1 for n in _CORPUS_OUTCOMES if "test_idle_and_compute_match_hta_definitions" in n)
    terminalreporter.write_line(
        f"corpus: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        f" of {len(_CORPUS_OUTCOMES)} corpus tests ({cases} trace cases of tests/test_corpus.py); {where}"
    )


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The one line a bad input gets (docs/bad-input.md): exit 2, `tracekit: ...`, no
    traceback, each of NEEDLES in it."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracekit: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
