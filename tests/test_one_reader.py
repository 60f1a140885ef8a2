"""Every input file is read through tracekit.guarded_read (issue #24 item 3): the source of
tracekit/ and dashboards/ is parsed, and every call that opens or reads a file by its path must
be a writer (a write mode, O_WRONLY/O_CREAT), be in the guarded reader itself, or be listed
below with the reason it is not an input file. A new direct reader fails this test until it goes
through the guarded reader (or is listed, with its reason, here), so the class stays closed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

GUARDED = "tracekit/guarded_read.py"

#: "file::function" -> why that read is not of an input file (or is guarded otherwise)
ALLOWED = {
    "tracekit/ingest/kineto_files.py::_available_memory": "/proc and /sys/fs/cgroup, not input",
    "tracekit/ingest/cache.py::fingerprint": "tracekit's own source files (the cache key)",
    "tracekit/ingest/cache.py::read_meta": "a cache entry of our own: lookup() checks it is a "
    "regular file and no symlink first; parquet, read by polars",
    "tracekit/ingest/cache.py::load": "the same entry read_meta() checked",
    "tracekit/ingest/spill.py::read": "the spill folder's parquet, written by this process",
    "tracekit/ingest/spill.py::lazy": "the spill folder's parquet, written by this process",
    "tracekit/ingest/kineto_stream.py::_pass_two": "the parts this read wrote into the spill "
    "folder (its first pass)",
    "tracekit/ingest/kineto.py::_idle_cpus": "/proc/loadavg",
    "tracekit/capture/records.py::cpu_model": "/proc/cpuinfo",
    "tracekit/capture/records.py::load_params": "tests' checksums of a run's parameters "
    "(torch.load with weights_only=True), not read by any command",
    "tracekit/capture/supervise.py::*": "/proc/<pid>/ of the job's processes",
    "tracekit/capture/contention.py::*": "/proc/<pid>/task/*/schedstat of the job's ranks",
    "tracekit/capture/outcome.py::_collect_rank_logs": "error.json the job's own ranks wrote in this "
    "command (tracekit run)",
    "tracekit/capture/netns.py::*": "EmulatedNetwork.open(): not a file",
    "tracekit/capture/launch.py::*": "EmulatedNetwork.open(): not a file",
    "tracekit/capture/run_json_update.py::update_run_json": "flock on the run folder, opened read-only: no read",
    "tracekit/report/static.py::*": "SVG files kaleido wrote into our own temporary folder",
    "tracekit/summary/__main__.py::*": "a developer tool reading the schema document",
    "dashboards/plotly_js.py::*": "the vendored plotly.js shipped with tracekit",
    "tracekit/outputs.py::*": "outputs: owner markers of tracekit's temporary folders",
}

_PATH_READS = {"read_text", "read_bytes"}
_MODULE_READS = {
    ("gzip", "open"),
    ("io", "open"),
    ("bz2", "open"),
    ("lzma", "open"),
    ("json", "load"),
    ("pickle", "load"),
    ("np", "load"),
    ("torch", "load"),
    ("mmap", "mmap"),
    ("pl", "read_parquet"),
    ("pl", "scan_parquet"),
    ("pl", "read_parquet_metadata"),
    ("pl", "read_csv"),
    ("pl", "read_json"),
    ("pl", "read_ndjson"),
    ("pq", "read_table"),
}
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT"}


def _mode(call: ast.Call, at: int) -> str | None:
    args = [a for a in call.args[at : at + 1]] + [k.value for k in call.keywords if k.arg == "mode"]
    for a in args:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            return a.value
    return None


def _is_writer(call: ast.Call, mode_at: int) -> bool:
    mode = _mode(call, mode_at)
    return mode is not None and any(c in mode for c in "wax+")


def _reads(tree: ast.AST) -> list[tuple[str, int, str]]:
    """(enclosing function, line, what) of every call that opens or reads a file by path."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                what = _what(child)
                if what:
                    found.append((where, child.lineno, what))
            visit(child, where)

    visit(tree, "<module>")
    return found


def _what(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open":
        return None if _is_writer(call, 1) else "open()"
    if not isinstance(f, ast.Attribute):
        return None
    owner = f.value.id if isinstance(f.value, ast.Name) else None
    if owner == "os" and f.attr == "open":
        flags = {n.attr for n in ast.walk(call) if isinstance(n, ast.Attribute)}
        return None if flags & _WRITE_FLAGS else "os.open()"
    if (owner, f.attr) in _MODULE_READS:
        return None if _is_writer(call, 1) else f"{owner}.{f.attr}()"
    if f.attr in _PATH_READS:
        return f".{f.attr}()"
    if f.attr == "open" and owner not in ("os",):  # Path.open
        return None if _is_writer(call, 0) else ".open()"
    return None


def _sources() -> list[Path]:
    return sorted(p for d in ("tracekit", "dashboards") for p in (ROOT / d).rglob("*.py"))


def direct_reads() -> list[str]:
    out = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel == GUARDED or "/vendor/" in rel:
            continue
        for where, line, what in _reads(ast.parse(path.read_text(), rel)):
            if f"{rel}::{where}" in ALLOWED or f"{rel}::*" in ALLOWED:
                continue
            out.append(f"{rel}:{line} in {where}(): {what}")
    return out


def test_every_input_file_goes_through_the_guarded_reader() -> None:
    found = direct_reads()
    assert not found, (
        "direct readers of files outside tracekit.guarded_read (read through it, or "
        "list the read in ALLOWED with why it is not an input file):\n" + "\n".join(found)
    )


def test_the_allow_list_is_not_stale() -> None:
    """Every listed function still exists and still reads: no blanket exemption outlives it."""
    reads: dict[str, set[str]] = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for where, _, _ in _reads(ast.parse(path.read_text(), rel)):
            reads.setdefault(rel, set()).add(where)
    for key in ALLOWED:
        rel, where = key.split("::")
        assert rel in reads and (where == "*" or where in reads[rel]), f"stale entry {key}"


@pytest.mark.parametrize(
    "snippet",
    [
        "json.loads(Path(p).read_bytes())",
        "open(p)",
        "open(p, 'rb')",
        "gzip.open(p, 'rb')",
        "os.open(p, os.O_RDONLY)",
        "pl.read_parquet(p)",
        "Path(p).open()",
    ],
)
def test_the_check_sees_a_direct_read(snippet: str) -> None:
    """The detector itself can fail: each of these reads is found."""
    assert _reads(ast.parse(f"def f(p):\n    return {snippet}\n")) != []


@pytest.mark.parametrize(
    "snippet", ["open(p, 'w')", "os.open(p, os.O_WRONLY | os.O_CREAT)", "gzip.open(p, 'wb')"]
)
def test_writers_are_not_readers(snippet: str) -> None:
    assert _reads(ast.parse(f"def f(p):\n    return {snippet}\n")) == []
