"""A declared world size, rank or step number never sizes an allocation.

Real traces (the dp sample's two ranks) with the numbers a trace or run.json may claim: world
size 100000, rank 2^31-1 of 2^31, run.json world_size 10^9, a step number past int32. Each is
analysed in a subprocess capped at 6 GB of address space (before: MemoryError, or 23 GB and the
OOM killer): it must finish, say which ranks are missing as ranges, and keep the traffic matrix
over the ranks that have traces. The figures (the Dash app's) are built from the result too.
"""

from __future__ import annotations

import gzip
import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES

DP = SAMPLES / "dp"
LIMIT = 6_000_000_000


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _analyze(folder: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracekit.cli", "analyze", str(folder), "--no-cache"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_cap,
    )


def _make(tmp: Path, edit, run_edit=None) -> Path:
    folder = tmp / "run"
    for r in (0, 1):
        trace = json.loads(gzip.decompress((DP / "traces" / f"rank{r}.json.gz").read_bytes()))
        edit(trace, r)
        path = folder / "traces" / f"rank{r}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    if run_edit is not None:
        run = json.loads((DP / "run.json").read_text())
        run_edit(run)
        (folder / "run.json").write_text(json.dumps(run))
    return folder


def _world(n):
    def edit(trace, rank):
        trace["distributedInfo"]["world_size"] = n

    return edit


def _big_rank(trace, rank):
    trace["distributedInfo"]["world_size"] = 2**31
    if rank == 1:
        trace["distributedInfo"]["rank"] = 2**31 - 1


CASES = {
    "world_100000": (_world(100_000), None, "ranks 2-99999 of world size 100000", [0, 1]),
    "rank_2^31-1": (_big_rank, None, "ranks 1-2147483646 of world size 2147483648", None),
    "run_json_10^9": (
        lambda t, r: None,
        lambda run: run.update(world_size=10**9),
        "ranks 2-999999999 of world size 1000000000 (run.json)",
        [0, 1],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_declared_sizes_do_not_allocate(case, tmp_path):
    edit, run_edit, warning, matrix_ranks = CASES[case]
    folder = _make(tmp_path, edit, run_edit)
    out = _analyze(folder, tmp_path / "out")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any(warning in w for w in summary["warnings"]), summary["warnings"]
    traffic = summary["traffic"]
    if matrix_ranks is not None:
        assert traffic["matrix_ranks"] == matrix_ranks
    n = len(traffic["matrix_ranks"])
    assert (
        n <= 3 and len(traffic["matrix"]) == n and all(len(row) == n for row in traffic["matrix"])
    )
    assert sum(map(sum, traffic["matrix"])) == traffic["total_bytes"]
    # what the Dash app does with this run (analyze, then every figure), under the same cap
    app = subprocess.run(
        [sys.executable, "-c", DASH_FIGURES, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_cap,
    )
    assert app.returncode == 0, app.stderr[-3000:]
    built = json.loads(app.stdout.splitlines()[-1])
    assert built["traffic_matrix"] and built["timeline"], built


DASH_FIGURES = """
import json, sys
from pathlib import Path
from tracekit import figures
from tracekit.analysis import analyze
figs = figures.figures_for(analyze(Path(sys.argv[1])))
print(json.dumps({k: v is not None for k, v in figs.items()}))
"""


def test_step_number_past_int32_is_read(tmp_path):
    def edit(trace, rank):
        for e in trace["traceEvents"]:
            if e.get("name") == "ProfilerStep#1":
                e["name"] = "ProfilerStep#3000000001"

    out = _analyze(_make(tmp_path, edit), tmp_path / "out")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["window"]["steps"] == 2


def test_step_number_past_int64_is_dropped_with_a_warning(tmp_path):
    def edit(trace, rank):
        for e in trace["traceEvents"]:
            if e.get("name") == "ProfilerStep#1":
                e["name"] = "ProfilerStep#" + "9" * 30

    out = _analyze(_make(tmp_path, edit), tmp_path / "out")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["window"]["steps"] == 1
    assert sum("past 64 bits" in w for w in summary["warnings"]) == 2  # one line per rank


def test_run_json_world_size_past_32_bits_is_bad_input(tmp_path):
    folder = _make(tmp_path, lambda t, r: None, lambda run: run.update(world_size=2**31 + 1))
    out = _analyze(folder, tmp_path / "out")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("tracekit: ") and "world_size" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_ranks_as_ranges():
    from tracekit.ingest.foreign import missing_ranges

    assert missing_ranges({0, 1}, 128) == [(2, 127)]
    assert missing_ranges({0, 5, 6, 9}, 10) == [(1, 4), (7, 8)]
    assert missing_ranges(set(range(4)), 4) == []
    assert missing_ranges({2**31 - 1}, 2**31) == [(0, 2**31 - 2)]


def test_pipeline_stages_and_microbatches_from_run_json_do_not_allocate(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(SAMPLES / "pp-1f1b", folder)
    run = json.loads((folder / "run.json").read_text())
    options = run["config"].get("strategy_options") or {}
    options.update(stages=10**9, microbatches=10**9)
    run["config"].update(strategy_options=options, microbatches=10**9)
    (folder / "run.json").write_text(json.dumps(run))
    out = _analyze(folder, tmp_path / "out")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    warnings = json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"]
    assert any("run.json says 1000000000 microbatches" in w for w in warnings), warnings
