"""tracekit never harms what it did not make: outputs, errors, signals and the cache (issue #14).

Each test reproduces one way an earlier version destroyed or polluted something, or showed a
traceback where one line and exit status 2 are promised: an --out that held other files (even
the input), a report path that was a FIFO, a symlink or a device, Ctrl-C ignored by `tracekit
run`, unparsed option values, a full disk, a stale cache entry, temp files left behind, CSV
formula injection, a Dash page answering HTTP 500, warnings wrapped over two lines, cache
entries written into other people's trace folders. Inputs are the committed sample runs.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, one_line_error, run_cli

from tracekit.analysis import analyze

DP = SAMPLES / "dp"
IS_ROOT = os.geteuid() == 0


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under FOLDER -> (size, mtime_ns): what must stay as it was."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def copy_run(dest: Path) -> Path:
    shutil.copytree(DP, dest, ignore=shutil.ignore_patterns("analysis", "*.events.parquet"))
    return dest


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """runs/dp-A and runs/dp-B: two copies of the committed DP sample run."""
    root = tmp_path / "runs"
    copy_run(root / "dp-A")
    copy_run(root / "dp-B")
    return root


# --- 1. --out never deletes what is not an analysis -------------------------------------------


@pytest.mark.parametrize(
    "out,cwd,needle",
    [
        ("runs", None, "holds the input"),  # the parent of every run
        ("runs/dp-A", None, "is the input"),  # the input folder itself
        (".", "runs", "holds the input"),  # the current folder, parent of the input
        ("notes", None, "not an analysis"),  # somebody's folder of other files
    ],
)
def test_out_that_is_not_an_analysis_is_refused(runs: Path, out: str, cwd: str | None, needle):
    base = runs.parent
    (base / "notes").mkdir()
    (base / "notes" / "thesis.tex").write_text("years of work")
    before = tree(base)
    where = base / cwd if cwd else base
    proc = run_cli("analyze", str(runs / "dp-A"), "--out", out, cwd=where)
    line = one_line_error(proc, needle, "choose another place with --out")
    assert out.rstrip("/").split("/")[-1] in line or out == "."
    assert tree(base) == before, "nothing added, moved or deleted"


def test_out_replaces_a_previous_analysis_only(runs: Path, tmp_path: Path):
    out = tmp_path / "an"
    first = run_cli("analyze", str(runs / "dp-A"), "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert (out / ".tracekit-analysis").is_file() and (out / "summary.json").is_file()
    assert stat.S_IMODE(out.stat().st_mode) & 0o055, "an ordinary folder, not a private temp one"
    again = run_cli("analyze", str(runs / "dp-B"), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "summary.json").read_text())["source"].endswith("dp-B")
    # an analysis written before the marker existed (summary.json + tables, no per-rank
    # folders then) is replaced too
    (out / ".tracekit-analysis").unlink()
    for table in ("events", "timeline"):
        shutil.rmtree(out / table)
        shutil.copy(out / "ranks.parquet", out / f"{table}.parquet")
    legacy = run_cli("analyze", str(runs / "dp-A"), "--out", str(out))
    assert legacy.returncode == 0, legacy.stderr
    # ... but not once something else lives in it
    (out / "my-notes.txt").write_text("mine")
    (out / ".tracekit-analysis").unlink()
    refused = run_cli("analyze", str(runs / "dp-A"), "--out", str(out))
    one_line_error(refused, str(out), "not an analysis")
    assert (out / "my-notes.txt").read_text() == "mine"


# --- 2. outputs are regular files: a FIFO, symlink, device or folder is never replaced --------


def _make(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "precious.txt").write_text("keep me")
        path.symlink_to(tmp_path / "precious.txt")
    elif kind == "device":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    else:
        path.mkdir()


def _kind(path: Path) -> str:
    mode = path.lstat().st_mode
    return {
        stat.S_ISFIFO(mode): "fifo",
        stat.S_ISLNK(mode): "symlink",
        stat.S_ISCHR(mode): "device",
        stat.S_ISDIR(mode): "folder",
    }.get(True, "file")


@pytest.mark.parametrize(
    "kind,fmt",
    [
        ("fifo", "md"),
        ("symlink", "perfetto"),
        ("symlink", "csv"),
        pytest.param(
            "device",
            "parquet",
            marks=pytest.mark.skipif(not IS_ROOT, reason="mknod of a device needs root"),
        ),
        ("folder", "json"),
    ],
)
def test_report_never_replaces_a_non_regular_path(tmp_path: Path, kind: str, fmt: str):
    target = tmp_path / f"out.{fmt}"
    _make(kind, target, tmp_path)
    proc = run_cli("report", str(DP), "-o", str(target), "--format", fmt)
    one_line_error(proc, str(target), "choose another place with -o")
    assert _kind(target) == kind
    if kind == "symlink":
        assert (tmp_path / "precious.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp files left"


def test_analyze_out_that_is_a_symlink_is_refused(tmp_path: Path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    proc = run_cli("analyze", str(DP), "--out", str(tmp_path / "link"))
    one_line_error(proc, "symbolic link", "--out")
    assert (tmp_path / "link").is_symlink() and list(real.iterdir()) == []


# --- 5. Ctrl-C stops `tracekit run` ---------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) from /proc (no psutil)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(d.name)] = (int(fields[1]), fields[0], fields[19])
    return out


def _rank_processes(root: int) -> dict[int, str]:
    """The descendants of ROOT that are ranks (LOCAL_RANK in their environment): pid -> start."""
    table = _proc_table()
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, start) in table.items():
            if ppid == parent:
                frontier.append(pid)
                try:
                    env = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
                if b"\0LOCAL_RANK=" in b"\0" + env:
                    found[pid] = start
    return found


def _alive(pid: int, start: str) -> bool:
    entry = _proc_table().get(pid)
    return entry is not None and entry[2] == start and entry[1] != "Z"


def test_ctrl_c_stops_run(tmp_path: Path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli", "run", "dp", "--nproc", "2", "--steps", "50"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr.txt").open("w"),  # read as a terminal would: never blocks
        start_new_session=True,  # a process group of its own, like a shell's foreground job
    )
    try:
        deadline, ranks = time.monotonic() + 120, {}
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = _rank_processes(proc.pid)
            if len(ranks) == 2 and list(tmp_path.glob("*/logs/launcher.log")):
                break
            time.sleep(0.2)
        assert len(ranks) == 2, "the ranks never started"
        time.sleep(3)  # the ranks are importing torch, or training: either way Ctrl-C must work
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        t0 = time.monotonic()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("tracekit run ignored Ctrl-C for 10 s")
        took = time.monotonic() - t0
        print(f"exited {took:.1f} s after Ctrl-C")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert took < 10
    assert proc.returncode == 130, stderr[-2000:]
    left = [pid for pid, start in ranks.items() if _alive(pid, start)]
    assert left == [], f"ranks still running: {left}"
    assert stderr.splitlines()[-1] == "tracekit: interrupted"  # (rank output comes before)
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    doc = json.loads((run / "run.json").read_text())
    assert doc["status"] == "interrupted"
    assert doc["errors"][0]["kind"] == "interrupted"


# --- 6. one line and exit 2, never a traceback -----------------------------------------------


def _run_limited(args: list[str], cwd: Path, env: dict | None = None):
    """`tracekit ARGS` under a 3 GB address-space limit; (completed process, peak RSS in MB)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    p = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
        env={**os.environ, **(env or {})},
    )
    out, err = p.stdout.read(), p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(args, p.returncode, out, err), usage.ru_maxrss / 1024


def test_a_huge_rank_range_is_tested_not_listed(tmp_path: Path):
    """Two billion ranks asked for cost what the two there cost: the same analysis without
    --ranks is the yardstick (an absolute bound fails on a loaded machine; listing the range
    would need 16 GB and meets the 3 GB limit)."""
    base, base_mb = _run_limited(["analyze", str(DP), "--out", str(tmp_path / "all")], ROOT)
    assert base.returncode == 0, base.stderr[-2000:]
    proc, peak_mb = _run_limited(
        ["analyze", str(DP), "--ranks", "0-2000000000", "--out", str(tmp_path / "an")], ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [
        r["rank"] for r in json.loads((tmp_path / "an" / "summary.json").read_text())["ranks"]
    ] == [0, 1]
    assert peak_mb < 1.25 * base_mb + 50, (peak_mb, base_mb)


@pytest.mark.parametrize(
    "ranks,needle",
    [("5-1", "5-1"), ("-3", "-3"), ("1,,x", "1,,x"), ("0-99999999999999999999999", "too large")],
)
def test_bad_rank_lists(tmp_path: Path, ranks: str, needle: str):
    proc = run_cli("analyze", str(DP), "--ranks", ranks, "--out", str(tmp_path / "an"))
    one_line_error(proc, "--ranks", needle)
    assert not (tmp_path / "an").exists()


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-5G"])
def test_max_trace_bytes_that_is_not_a_size(tmp_path: Path, value: str):
    proc = run_cli(
        "analyze",
        str(DP),
        "--no-cache",
        "--out",
        str(tmp_path / "an"),
        env={"TRACEKIT_MAX_TRACE_BYTES": value},
    )
    one_line_error(proc, "TRACEKIT_MAX_TRACE_BYTES", value)
    assert not (tmp_path / "an").exists()


def _on_full_disk(tmp_path: Path, size: str, command: str) -> subprocess.CompletedProcess:
    """COMMAND (a shell line; $T is tracekit, $D the folder) with a SIZE tmpfs mounted on $D in a
    private mount namespace; its last stdout line lists what was left in $D."""
    if not IS_ROOT or not shutil.which("unshare"):
        pytest.skip("mounting a small tmpfs needs root and unshare")
    disk = tmp_path / "disk"
    disk.mkdir()
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=4k tmpfs {disk}"],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"mount not permitted here: {probe.stderr.decode().strip()}")
    script = (
        f'mount -t tmpfs -o size={size} tmpfs "$D" && {command}; rc=$?; '
        'echo "left:$(ls -A "$D" | tr "\\n" " ")"; exit $rc'
    )
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "D": str(disk), "T": f"{sys.executable} -m tracekit.cli"},
        timeout=300,
    )


def test_full_disk_under_out(tmp_path: Path):
    proc = _on_full_disk(tmp_path, "64k", f'$T analyze {DP} --out "$D/an"')
    one_line_error(proc, "cannot write the analysis here (No space left on device)", "--out")
    assert proc.stdout.splitlines()[-1].strip() == "left:", "nothing half-written"


def test_full_disk_under_report_out(tmp_path: Path):
    proc = _on_full_disk(tmp_path, "16k", f'$T report {DP} -o "$D/report.html"')
    one_line_error(proc, "cannot write the report here (No space left on device)", "-o")
    assert proc.stdout.splitlines()[-1].strip() == "left:", "nothing half-written"


# --- 7. smaller: cache key on content, temp sweeps, CSV, Dash, one warning per line ----------


def test_cache_sees_a_rewrite_with_the_same_size_and_mtime(tmp_path: Path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for r in (0, 1):
        raw = gzip.decompress((DP / "traces" / f"rank{r}.json.gz").read_bytes())
        (folder / f"rank{r}.json").write_bytes(raw)
    trace = folder / "rank0.json"
    first = analyze(folder, cache=True)
    raw = trace.read_bytes()
    st = trace.stat()
    # one duration's leading digit changed: the same size; then the old mtime put back
    at = raw.index(b'"dur": ') + len(b'"dur": ')
    assert raw[at : at + 1] in b"12345678"
    changed = raw[:at] + bytes([raw[at] + 1]) + raw[at + 1 :]
    assert len(changed) == len(raw) and changed != raw
    trace.write_bytes(changed)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert trace.stat().st_size == st.st_size and trace.stat().st_mtime_ns == st.st_mtime_ns
    cached = analyze(folder, cache=None)
    fresh = analyze(folder, cache=False)

    def total(a) -> int:
        return int((a.events["end_ns"] - a.events["start_ns"]).sum())

    assert total(fresh) != total(first), "the rewrite changed an event"
    assert total(cached) == total(fresh), "the cache gave the old events back"


def test_only_leftovers_that_prove_ours_are_swept(tmp_path: Path, monkeypatch):
    """A killed analysis's temporary folder holds our owner marker: swept. Everything else stays,
    whatever its name: a user's folders and files named like ours, a folder of ours without its
    marker or with a forged one, our temporary files, a fresh folder of a live owner."""
    from tracekit import outputs

    cache_dir = Path(os.environ["TRACEKIT_CACHE_DIR"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    dead = 2**22 + 12345  # above the default pid_max: never a live process
    dead_dir = tmp_path / f".an.tmp-{dead}-a1b2c3d4"  # ours (marker below), owner gone: swept
    live_dir = tmp_path / f".an.tmp-{os.getpid()}-0badcafe"  # ours, fresh, owner alive: kept
    for d in (dead_dir, live_dir):
        outputs.make_owned_folder(d)
        (d / "summary.json").write_text("{}")
    forged = tmp_path / f".an.tmp-{dead}-deadbeef"  # our name, a marker of another folder's line
    forged.mkdir()
    (forged / outputs.OWNER_FILE).write_text(
        f"tracekit temporary folder pid={dead} token=a1b2c3d4\n"
    )
    decoys = {
        tmp_path / ".thesis.old-4242": "chapter 1",
        tmp_path / ".photos.tmp-20240101": "jpeg",
        tmp_path / f".an.tmp-{dead}-x1y2z3w4": "no marker",  # our name, no marker
        tmp_path / ".an.tmp-abcd1234": "an old mkdtemp name",
    }
    for d, text in decoys.items():
        d.mkdir()
        (d / "notes.tex").write_text(text)
    files = {
        tmp_path / ".bashrc.old-2019": b"alias ll='ls -l'",
        tmp_path / ".draft.9999-v2.tmp": b"draft",
        cache_dir / f".rank0-0123456789.events.parquet.{dead}-a1b2c3d4.tmp": b"PAR1",
    }
    for f, data in files.items():
        f.write_bytes(data)
    hour_ago = time.time() - 2 * 3600
    for p in [*decoys, *files, forged]:
        os.utime(p, (hour_ago, hour_ago))
    proc = run_cli("analyze", str(DP), "--out", str(tmp_path / "an"))
    assert proc.returncode == 0, proc.stderr
    assert not dead_dir.exists()
    assert live_dir.exists() and forged.exists()
    for d, text in decoys.items():
        assert (d / "notes.tex").read_text() == text, d
    for f, data in files.items():
        assert f.read_bytes() == data, f
    assert not (tmp_path / "an" / outputs.OWNER_FILE).exists()  # the result holds no marker


def test_csv_cells_cannot_be_formulas(tmp_path: Path):
    run = tmp_path / '=HYPERLINK("evil.example";"x")'  # a folder of traces: named by its name
    shutil.copytree(DP / "traces", run, ignore=shutil.ignore_patterns("*.events.parquet"))
    out = tmp_path / "report.csv"
    proc = run_cli("report", str(run), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    import csv

    rows = list(csv.DictReader(out.open()))
    assert rows and all(r["run"].startswith("'=HYPERLINK") for r in rows)
    assert all(r["path"].startswith("/") for r in rows)  # harmless cells stay as they are
    float(rows[0]["span_s"])  # numbers stay numbers


def test_dash_answers_crafted_zoom_and_broken_runs_without_500(tmp_path: Path):
    import dataclasses

    from dashboards.app import create_app

    class Exploding(dict):
        """A summary with a bug behind every key: what any non-tracekit error looks like."""

        def __getitem__(self, key: object) -> None:
            raise RuntimeError("a bug in an analysis section")

        get = __contains__ = __getitem__

    good = analyze(DP)
    broken = dataclasses.replace(good, summary=Exploding())
    app = create_app(tmp_path, analyses={"good": good, "broken": broken})
    client = app.server.test_client()
    assert client.get("/").status_code == 200

    page_out = "..nav.children...controls.children...page.children.."
    page_outputs = [
        {"id": "nav", "property": "children"},
        {"id": "controls", "property": "children"},
        {"id": "page", "property": "children"},
    ]

    def page(path: str, search: str):
        body = {
            "output": page_out,
            "outputs": page_outputs,
            "inputs": [
                {"id": "url", "property": "pathname", "value": path},
                {"id": "url", "property": "search", "value": search},
            ],
            "changedPropIds": ["url.pathname"],
        }
        return client.post("/_dash-update-component", json=body)

    for path in ("/", "/timeline", "/traffic", "/overlap", "/pipeline"):
        resp = page(path, "?run=broken")
        assert resp.status_code == 200, (path, resp.status_code)
        text = resp.get_data(as_text=True)
        assert "Traceback" not in text and "could not show this run" in text, text[:500]
    zoom_out = "..timeline-graph.figure...timeline-info.children.."
    for crafted in (
        {"xaxis.range[0]": "abc", "xaxis.range[1]": 5},
        {"xaxis.range": ["nan", "inf"]},
        {"xaxis.range": [0, 1e300], "yaxis.range": [{"x": 1}, 2]},
        {"xaxis.range": "0,1"},
    ):
        body = {
            "output": zoom_out,
            "outputs": [
                {"id": "timeline-graph", "property": "figure"},
                {"id": "timeline-info", "property": "children"},
            ],
            "inputs": [{"id": "timeline-zoom", "property": "data", "value": crafted}],
            "state": [{"id": "url", "property": "search", "value": "?run=good"}],
            "changedPropIds": ["timeline-zoom.data"],
        }
        resp = client.post("/_dash-update-component", json=body)
        assert resp.status_code == 200, (crafted, resp.status_code)
        text = resp.get_data(as_text=True)
        assert "Traceback" not in text and "zoom ignored" in text, text[:300]


def test_one_warning_is_one_line_when_stderr_is_not_a_terminal(tmp_path: Path):
    proc = run_cli("analyze", str(DP), "--sample", "1", "--out", str(tmp_path / "an"))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert warnings and any(len(w) > 80 for w in warnings), lines
    assert all(line.startswith(("warning: ", "wrote ")) for line in lines), lines


# --- 8. the cache lives in a per-user folder, never in other people's trace folders ----------


def test_cache_goes_to_the_user_cache_dir_not_beside_the_traces(tmp_path: Path):
    shared = copy_run(tmp_path / "shared" / "dp")
    before = tree(shared)
    xdg = tmp_path / "xdg"
    env: dict[str, str | None] = {"TRACEKIT_CACHE_DIR": None, "XDG_CACHE_HOME": str(xdg)}
    proc = run_cli("analyze", str(shared), "--out", str(tmp_path / "an"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert tree(shared) == before, "the shared run folder is left as it was"
    entries = sorted((xdg / "tracekit").glob("*.events.parquet"))
    assert [e.name.split("-")[0] for e in entries] == ["rank0", "rank1"]
    # --cache-dir puts them elsewhere; the size cap evicts the least recently used first
    other = tmp_path / "other-cache"
    env["TRACEKIT_CACHE_MAX_BYTES"] = str(max(e.stat().st_size for e in entries) + 1)
    capped = run_cli(
        "analyze", str(shared), "--out", str(tmp_path / "an"), "--cache-dir", str(other), env=env
    )
    assert capped.returncode == 0, capped.stderr
    assert len(list(other.glob("*.events.parquet"))) == 1, "capped: one entry kept"
    assert tree(shared) == before
