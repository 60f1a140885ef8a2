"""An unchanged table is hard-linked from the earlier analysis in the same folder, never encoded
again; anything changed (content, order, the file itself, the writer) is written anew."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from builders.traces import NCCL_DATA

from tracekit.analysis_folder import MARKER, write_analysis
from tracekit.analyze import analyze
from tracekit.ingest.cache import content_hash


@pytest.fixture(scope="module")
def result():  # noqa: ANN201 - an Analysis
    return analyze(NCCL_DATA, cache=False)


def inodes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_ino for p in out.rglob("*.parquet")}


def test_an_unchanged_analysis_links_its_tables(result, tmp_path: Path) -> None:  # noqa: ANN001
    out = write_analysis(result, tmp_path / "a")
    first, summary = inodes(out), (out / "summary.json").read_bytes()
    write_analysis(result, out)
    assert inodes(out) == first and len(first) >= 4
    assert (out / "summary.json").read_bytes() == summary
    for name, frame in result.tables().items():
        assert pl.read_parquet(out / f"{name}.parquet").equals(frame)
    for rank, plan in result.rank_tables()["events"].items():
        assert pl.read_parquet(out / "events" / f"rank{rank}.parquet").equals(plan.collect())
    marker = json.loads((out / MARKER).read_text())
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert sorted(marker["files"]) == sorted(written - {MARKER})


def test_a_touched_file_or_other_writer_is_written_again(result, tmp_path: Path) -> None:  # noqa: ANN001
    out = write_analysis(result, tmp_path / "a")
    first = inodes(out)
    ranks = out / "ranks.parquet"
    os.utime(ranks, ns=(0, 0))  # looks edited since: never trusted
    write_analysis(result, out)
    second = inodes(out)
    assert second["ranks.parquet"] != first["ranks.parquet"]
    assert second["events/rank0.parquet"] == first["events/rank0.parquet"]
    marker = json.loads((out / MARKER).read_text())
    marker["writer"] = "another polars"
    (out / MARKER).write_text(json.dumps(marker))
    write_analysis(result, out)
    assert not set(inodes(out).values()) & set(second.values())


def test_content_hash_sees_values_order_and_schema() -> None:
    a = pl.DataFrame({"x": [1, 2, 3], "y": ["a", None, "c"]})
    assert content_hash(a) == content_hash(a.clone())
    assert content_hash(a) != content_hash(a.reverse())
    assert content_hash(a) != content_hash(a.with_columns(pl.col("x").cast(pl.Int32)))
    assert content_hash(a) != content_hash(a.with_columns(y=pl.lit("a")))
    assert content_hash(a.head(0)) != content_hash(a.head(0).cast({"x": pl.Int8}))


def test_a_ranks_events_are_its_cache_entry_when_the_same(tmp_path: Path) -> None:
    """A first analysis links each rank's events file to the trace's cache entry when that
    holds the very same table (no clock shift), and the file reads back as the rank's events."""
    cache_dir = tmp_path / "cache"
    result = analyze(NCCL_DATA, cache=True, cache_dir=cache_dir)
    out = write_analysis(result, tmp_path / "a", cache_dir)
    (entry,) = cache_dir.glob("*.events.parquet")
    (rank,) = result.rank_tables()["events"]
    events = out / "events" / f"rank{rank}.parquet"
    assert events.stat().st_ino == entry.stat().st_ino
    assert pl.read_parquet(events).equals(result.rank_tables()["events"][rank].collect())
    other = write_analysis(result, tmp_path / "b")  # another cache folder: written, not linked
    assert (other / "events" / f"rank{rank}.parquet").stat().st_ino != entry.stat().st_ino
