"""The per-rank map and cross-rank reduce (issue #17): the driver keeps slim events and small
per-rank results; each rank's events wait in memory within a budget, else in files.

Every check compares a real analysis of real traces with the events spilled against the same
analysis with them held (the whole-job step, as before): the summary, the written tables and
the per-rank frames must not change with where the events wait.
"""

from __future__ import annotations

import gc
import os
import subprocess
import tempfile
from pathlib import Path

import polars as pl
import pytest
from builders.traces import HTA as HTA_CORPUS
from conftest import SAMPLES, run_cli

from tracekit import outputs
from tracekit.analyses.event_totals import event_totals
from tracekit.analysis import analyze
from tracekit.analysis_folder import is_analysis, write_analysis
from tracekit.ingest.load import load
from tracekit.ingest.read_options import ReadOptions
from tracekit.ingest.spill import PREFIX
from tracekit.summary import encode

INPUTS = [
    SAMPLES / "dp",
    SAMPLES / "pp-1f1b",
    SAMPLES / "fsdp",
    pytest.param(HTA_CORPUS / "nccl_parser_config", marks=pytest.mark.corpus),
    Path(__file__).parent / "data" / "gpu" / "dp-cuda-nccl",
]


def _spill_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(PREFIX))


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: Path(p).name)
def test_spilled_ranks_give_the_held_summary_and_tables(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_SPILL_DIR", str(tmp_path / "scratch"))
    held = analyze(path, cache=False)
    assert all(ref.frame is not None for ref in held.events_at.values())
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", "0")
    spilled = analyze(path, cache=False)
    assert spilled.events_at and all(ref.path for ref in spilled.events_at.values())
    assert all(ref.path for ref in spilled.timeline_at.values())
    assert encode(spilled.summary) == encode(held.summary)
    for name in ("ranks", "collectives", "overlap_units", "pipeline_ops", "bubbles"):
        a, b = held.tables().get(name), spilled.tables().get(name)
        assert (a is None) == (b is None), name
        if isinstance(a, pl.DataFrame):
            assert a.equals(b), name
    assert spilled.events.equals(held.events)
    assert spilled.timeline.equals(held.timeline)
    # the top events, summed per rank by the map, are one group_by over every event
    key = ["name", "kind", "device"]
    whole = event_totals(held.events).sort(key)
    assert whole.height and spilled.event_totals.sort(key).equals(whole)
    assert held.event_totals.sort(key).equals(whole)
    for rank, ref in spilled.timeline_at.items():  # one rank's timeline is a file of its own
        assert ref.read().equals(held.timeline.filter(pl.col("rank") == rank))
    out_a, out_b = write_analysis(held, tmp_path / "a"), write_analysis(spilled, tmp_path / "b")
    for name in ("events", "timeline"):  # one file per rank, read as one
        ranks = sorted(spilled.timeline_at)
        names = sorted(p.name for p in (out_b / name).iterdir())
        assert names == sorted(f"rank{r}.parquet" for r in ranks)
        assert (
            pl.read_parquet(out_b / name)
            .sort("rank", maintain_order=True)
            .equals(pl.read_parquet(out_a / name).sort("rank", maintain_order=True))
        )
        assert (
            pl.read_parquet(out_a / name)
            .sort("rank", maintain_order=True)
            .equals(held.events if name == "events" else held.timeline)
        )
    assert _spill_folders(tmp_path / "scratch")  # in use while the analysis lives
    del spilled
    gc.collect()
    assert _spill_folders(tmp_path / "scratch") == []  # ours, and gone with it


def test_a_budget_of_one_rank_mixes_held_and_spilled_ranks(tmp_path, monkeypatch):
    """Which ranks stay in memory depends on which parse finishes first: the results are put
    together in rank order whatever the split."""
    path = SAMPLES / "pp-1f1b"  # p2p transfers: each rank's split needs its peers' times
    held = analyze(path, cache=False)
    one_rank = max(ref.read().estimated_size() for ref in held.events_at.values())
    monkeypatch.setenv("TRACEKIT_SPILL_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", str(one_rank))
    mixed = analyze(path, cache=False)
    kinds = {r: ref.frame is not None for r, ref in mixed.events_at.items()}
    assert set(kinds.values()) == {False, True}, kinds
    assert encode(mixed.summary) == encode(held.summary)
    assert mixed.events.equals(held.events) and mixed.timeline.equals(held.timeline)


def test_the_driver_keeps_slim_events_only(tmp_path, monkeypatch):
    """With every rank spilled the Job holds the calls, kernels and annotations of each rank:
    a small part of its events, and nothing of the compute."""
    monkeypatch.setenv("TRACEKIT_SPILL_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", "0")
    job = load(Path(__file__).parent / "data" / "gpu" / "dp-cuda-nccl", ReadOptions(cache=False))
    assert all(ref.frame is None for ref in job.rank_events.values())
    whole = pl.concat([ref.read() for ref in job.rank_events.values()])
    assert whole.height > 20 * job.events.height, (whole.height, job.events.height)
    kinds = set(job.events["kind"].unique().to_list())
    assert "compute" not in kinds and "runtime" not in kinds, kinds
    assert whole.filter(pl.col("kind") == "communication").height == (
        job.events.filter(pl.col("kind") == "communication").height
    )


def test_spilling_leaves_other_files_in_the_scratch_root(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    (root / "tracekit-spill-not-ours").write_text("a file, not our folder")
    (root / f"{PREFIX}999999999-0badc0de").mkdir()  # no such pid, but a shared root: kept
    monkeypatch.setenv("TRACEKIT_SPILL_DIR", str(root))
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", "0")
    result = analyze(SAMPLES / "dp", cache=False)
    assert result.summary.ranks
    del result
    gc.collect()
    assert sorted(os.listdir(root)) == [
        f"{PREFIX}999999999-0badc0de",
        "notes.txt",
        "tracekit-spill-not-ours",
    ]
    assert (root / "notes.txt").read_text() == "mine"


def test_a_bad_memory_budget_is_one_line(tmp_path):
    env = {"TRACEKIT_MEMORY_BUDGET": "lots"}
    done = run_cli(
        "analyze", str(SAMPLES / "dp"), "--out", str(tmp_path / "out"), env=env
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRACEKIT_MEMORY_BUDGET" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_an_analysis_with_anything_else_in_its_per_rank_folders_is_not_replaced(tmp_path):
    out = write_analysis(analyze(SAMPLES / "dp", cache=False), tmp_path / "out")
    assert is_analysis(out)
    (out / "events" / "notes.txt").write_text("mine")
    assert not is_analysis(out)
    (out / "events" / "notes.txt").unlink()
    (out / "photos").mkdir()  # an empty folder of the user's, beside ours
    assert not is_analysis(out)
    (out / "photos").rmdir()
    (out / "timeline" / "rank9.parquet").symlink_to(out / "ranks.parquet")
    assert not is_analysis(out)


def test_zooming_into_one_rank_reads_only_that_ranks_events(tmp_path, monkeypatch):
    """The app's zoomed timeline of a spilled analysis: the same figure as from the whole
    events frame, drawn without reading the other ranks' events (Analysis.events stays unread)."""
    from dashboards.pages.timeline import detail_figure

    path = SAMPLES / "pp-1f1b"
    held = analyze(path, cache=False)
    monkeypatch.setenv("TRACEKIT_SPILL_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", "0")
    spilled = analyze(path, cache=False)
    read: list[int] = []
    real = spilled.rank_events

    def spy(rank: int) -> pl.LazyFrame:
        read.append(rank)
        return real(rank)

    monkeypatch.setattr(spilled, "rank_events", spy)
    step = held.summary.ranks[1].step_time_s
    # the top lanes: the view shows lanes 1-3 (one lane of margin each side), not rank 0's
    zoom = {"xaxis.range[0]": 0.0, "xaxis.range[1]": step / 50, "yaxis.range": [2.7, 3.2]}
    want, _ = detail_figure(held, zoom)
    got, info = detail_figure(spilled, zoom)
    assert got.layout["meta"]["mode"] == "detail" and got.layout["meta"]["events"] > 0, info
    assert got.to_json() == want.to_json()
    assert sorted(read) == [1, 2, 3], read  # the lanes shown, each once
    assert "events" not in vars(spilled)  # every rank's events were never read


def test_the_spill_of_a_killed_analysis_is_swept_by_the_next(tmp_path, monkeypatch):
    """In this machine's temporary folder, spill folders of processes that are gone (a killed
    analysis) go when the next analysis makes its own; a live process's and the rest stay."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TRACEKIT_SPILL_DIR", raising=False)
    monkeypatch.setenv("TRACEKIT_MEMORY_BUDGET", "0")
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid belongs to no process
    gone = tmp_path / f"{PREFIX}{dead.pid}-0badc0de"
    outputs.make_owned_folder(gone)  # as a spill makes it: with its owner marker
    (gone / "events-x.parquet").write_bytes(b"left by a killed analysis")
    live = tmp_path / f"{PREFIX}1-0badc0de"  # pid 1 is alive
    outputs.make_owned_folder(live)
    unmarked = tmp_path / f"{PREFIX}{dead.pid}-0ddba11a"  # our name, no marker: not provably ours
    unmarked.mkdir()
    (tmp_path / "notes").mkdir()
    result = analyze(SAMPLES / "dp", cache=False)
    assert not gone.exists() and live.is_dir() and (tmp_path / "notes").is_dir()
    assert unmarked.is_dir()
    assert len(_spill_folders(tmp_path)) == 3  # the live one, the unmarked, ours while in use
    del result
    gc.collect()
    assert sorted(_spill_folders(tmp_path)) == sorted([live.name, unmarked.name])
