"""The columnar cache (tracekit.ingest.cache): parsed events as parquet, reused while a trace is unchanged.

Real traces from the corpus's hta/ (trace_filter: two ranks of a real GPU job) and the committed
DP sample run; the cache is checked against a fresh parse, never against itself.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import HTA, SAMPLES, run_cli, spy_parses
from polars.testing import assert_frame_equal

from tracekit.analysis import analyze
from tracekit.ingest import cache, cache_paths
from tracekit.ingest.kineto import read_traces

TRACE_FILTER = sorted((HTA / "trace_filter").glob("*.json.gz"))


@pytest.fixture()
def traces(tmp_path: Path) -> list[Path]:
    """A writable copy of trace_filter's two ranks."""
    out = []
    for f in TRACE_FILTER:
        shutil.copy(f, tmp_path / f.name)
        out.append(tmp_path / f.name)
    return out


@pytest.fixture(scope="module")
def fresh() -> tuple[list, pl.DataFrame]:
    """trace_filter parsed without any cache: the reference."""
    return read_traces(TRACE_FILTER, workers=1, cache=False)


@pytest.mark.corpus
def test_entries_are_written_to_the_cache_folder_and_read_back_identical(
    traces, fresh, monkeypatch
):
    infos, events = read_traces(traces, workers=1, cache=True)
    # tests: a tmp folder
    assert cache_paths.default_dir() == Path(os.environ["TRACEKIT_CACHE_DIR"])
    for t in traces:
        entry = cache.in_dir(t)
        assert entry.parent == cache_paths.default_dir() and entry.is_file()
        assert entry.name.startswith(t.name.removesuffix(".json.gz") + "-")
        assert not cache.beside(t).exists(), "never beside the trace"
    assert_frame_equal(events, fresh[1])
    parsed = spy_parses(monkeypatch)
    infos2, events2 = read_traces(traces, workers=1, cache=None)
    assert parsed == [], "a matching entry is read, the JSON is not parsed"
    assert_frame_equal(events2, fresh[1])
    for a, b in zip(infos2, fresh[0]):
        assert a.path in traces
        assert {**vars(a), "path": None} == {**vars(b), "path": None}
    # the entry holds its key and TraceInfo in the parquet metadata: one self-describing file
    meta = cache.read_meta(cache.in_dir(traces[0]))
    assert meta["key"] == cache.key(traces[0]) and meta["info"]["rank"] == 0
    assert meta["path"] == str(traces[0].resolve())


@pytest.mark.corpus
def test_a_changed_trace_is_parsed_again(traces, monkeypatch):
    read_traces(traces, workers=1, cache=True)
    stat = traces[0].stat()
    os.utime(traces[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: new mtime
    parsed = spy_parses(monkeypatch)
    read_traces(traces, workers=1, cache=True)
    assert parsed == [traces[0]]
    assert cache.read_meta(cache.in_dir(traces[0]))["key"] == cache.key(traces[0]), (
        "entry rewritten"
    )


@pytest.mark.corpus
def test_entries_of_other_code_or_damaged_are_ignored(traces, fresh, monkeypatch):
    read_traces(traces, workers=1, cache=True)
    cache.in_dir(traces[0]).write_bytes(b"PAR1 not really parquet")
    entry = cache.in_dir(traces[1])
    meta = cache.read_meta(entry)
    meta["key"]["code"] = "0.0.0+other-ingest-code"
    pl.read_parquet(entry).write_parquet(entry, metadata={"tracekit.cache": json.dumps(meta)})
    parsed = spy_parses(monkeypatch)
    _, events = read_traces(traces, workers=1, cache=None)
    assert sorted(parsed) == sorted(traces)
    assert_frame_equal(events, fresh[1])


@pytest.mark.corpus
def test_trace_folders_are_never_written(traces, tmp_path):
    """Analysing writes entries into the cache folder only: a folder of traces (shared, another
    user's, read-only) is left as it is."""
    folder = traces[0].parent / "others_traces"
    folder.mkdir()
    for t in traces:
        t.rename(folder / t.name)
    before = sorted(p.name for p in folder.iterdir())
    out = tmp_path / "analysis"
    first = run_cli("analyze", str(folder), "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in folder.iterdir()) == before
    entries = sorted(cache_paths.default_dir().glob("*.events.parquet"))
    assert [e.name.split("-")[0] for e in entries] == ["sampled_rank", "sampled_rank"]
    assert not (out / "cache").exists()
    summary = json.loads((out / "summary.json").read_text())
    # the second run reads the entries and gives the same numbers
    again = run_cli("analyze", str(folder), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert sorted(cache_paths.default_dir().glob("*.events.parquet")) == entries
    assert json.loads((out / "summary.json").read_text())["ranks"] == summary["ranks"]


@pytest.mark.corpus
def test_no_cache_option_writes_none(traces, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("analyze", str(traces[0].parent), "--out", str(out), "--no-cache")
    assert proc.returncode == 0, proc.stderr
    assert not list(traces[0].parent.glob("*.events.parquet")) and not (out / "cache").exists()
    assert not list(cache_paths.default_dir().glob("*.events.parquet"))


@pytest.mark.corpus
def test_the_python_api_reads_entries_but_writes_none_by_default(traces, monkeypatch):
    analyze(traces[0].parent)
    assert not list(cache_paths.default_dir().glob("*.events.parquet"))
    analyze(traces[0].parent, cache=True)
    assert len(list(cache_paths.default_dir().glob("*.events.parquet"))) == 2
    assert not list(traces[0].parent.glob("*.events.parquet"))
    parsed = spy_parses(monkeypatch)
    result = analyze(traces[0].parent)
    assert parsed == [] and [r.rank for r in result.summary.ranks] == [0, 1]


@pytest.mark.corpus
def test_workers_store_entries_too(traces, fresh):
    """The spawned-worker path parses, stores and ships frames back like the in-process one."""
    infos, events = read_traces(traces, workers=2, cache=True)
    assert_frame_equal(events, fresh[1])
    assert all(cache.in_dir(t).is_file() for t in traces)


def test_ingest_at_source(tmp_path, monkeypatch):
    """capture.write_events_parquet: what a rank runs on its own trace when it finishes."""
    from tracekit.capture import write_events_parquet

    run = tmp_path / "dp"
    shutil.copytree(
        SAMPLES / "dp", run, ignore=shutil.ignore_patterns("analysis", "*.events.parquet")
    )
    reference = analyze(run, cache=False)
    for trace in sorted((run / "traces").glob("rank*.json.gz")):
        entry = write_events_parquet(trace)
        assert entry == trace.with_name(trace.name.replace(".json.gz", ".events.parquet"))
    parsed = spy_parses(monkeypatch)
    result = analyze(run)
    assert parsed == [], "the analysis used the ranks' own parquet"
    assert result.summary.ranks == reference.summary.ranks
    assert_frame_equal(result.events, reference.events)
    # a damaged trace is reported on stderr and never raises (it runs inside the training job)
    bad = tmp_path / "rank9.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00 not gzip")
    assert write_events_parquet(bad) is None


@pytest.mark.corpus
def test_the_cache_folder_is_capped_least_recently_used_first(traces):
    read_traces(traces, workers=1, cache=True)
    a, b = (cache.in_dir(t) for t in traces)
    long_ago = time.time() - 1000
    os.utime(a, (long_ago, long_ago))
    os.utime(b, (long_ago + 10, long_ago + 10))  # written after a ...
    read_traces(traces[:1], workers=1, cache=None)  # ... but a was used since: a hit marks it
    assert a.stat().st_mtime > b.stat().st_mtime
    assert cache.evict(cache_paths.default_dir(), cap=a.stat().st_size) == a.stat().st_size
    assert a.exists() and not b.exists()


def test_eviction_removes_only_entries_we_wrote(tmp_path):
    """A user's own ``*.events.parquet`` in the cache folder (no key of ours in its metadata) is
    never counted nor evicted, even at a cap of one byte; our entry is."""
    cache_dir = tmp_path / "udata"
    cache_dir.mkdir()
    mine = cache_dir / "mydata.events.parquet"
    pl.DataFrame({"x": [1, 2, 3]}).write_parquet(mine)
    before = mine.read_bytes()
    trace = next((SAMPLES / "dp" / "traces").glob("*.json*"))
    read_traces([trace], workers=1, cache=True, cache_dir=cache_dir)
    ours = [p for p in cache_dir.iterdir() if p != mine]
    assert ours and all(cache.is_entry(p) for p in ours) and not cache.is_entry(mine)
    cache.evict(cache_dir, cap=1)
    assert mine.read_bytes() == before
    assert not any(p.exists() for p in ours)


@pytest.mark.corpus
def test_a_bad_cache_cap_is_one_line(traces, tmp_path):
    proc = run_cli(
        "analyze",
        str(traces[0].parent),
        "--out",
        str(tmp_path / "an"),
        env={"TRACEKIT_CACHE_MAX_BYTES": "lots"},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("tracekit: TRACEKIT_CACHE_MAX_BYTES=")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
