"""Pipeline bubbles: per stage and step, and over the whole profiled span.

- pipeline window of a step: first F start on any stage to last B (or W) end on any stage.
- bubble of a stage in a step: window time it is not busy, split into fill (before its first op),
  drain (after its last op) and steady (gaps between its ops). Time blocked in recv is bubble.
- bubble_fraction = sum of bubbles / (stages x sum of windows).
- bubble_fraction_span: the same over the whole profiled span (first to last step marker of all
  pipeline ranks), with the weight update (``optimizer`` / ``Optimizer.step#...``) counted as
  busy, since PipeDream updates after every microbatch; the number to compare asynchronous
  PipeDream (no flush, no windows) with GPipe.

A rank holding several stages (interleaved) is one device: its bubbles are computed over all
its stages together. Frame ``bubbles`` (rank, stage, step, phase, start_ns, end_ns).
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl

Pieces = dict[int, list[tuple[int, int]]]

BUBBLES_SCHEMA = {
    "rank": pl.Int32,
    "stage": pl.Int64,
    "step": pl.Int64,
    "phase": pl.Utf8,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}
UPDATE = r"^(optimizer$|Optimizer\.step#)"


def step_windows(ops: pl.DataFrame) -> pl.DataFrame:
    """step, lo, hi: each step's pipeline window, over all stages (steps without one left out)."""
    win = (
        ops.group_by("step")
        .agg(
            pl.col("start_ns").filter(pl.col("kind") == "F").min().alias("lo"),
            pl.col("end_ns").filter(pl.col("kind") != "F").max().alias("hi"),
        )
        .sort("step")
    )
    return win.filter(
        pl.col("lo").is_not_null() & pl.col("hi").is_not_null() & (pl.col("hi") > pl.col("lo"))
    )


def step_bubbles(
    win: pl.DataFrame, pieces: Pieces, stage_of_rank: dict[int, int]
) -> tuple[dict[int, defaultdict[str, float]], list[dict[str, int | str]]]:
    """(per rank: busy, window, fill, steady, drain ns summed over the steps; the bubble rows)."""
    ranks = sorted(stage_of_rank)
    bubble_rows: list[dict[str, int | str]] = []
    per: dict[int, defaultdict[str, float]] = {r: defaultdict(float) for r in ranks}
    for step, lo, hi in win.iter_rows():
        for r in ranks:
            mine = _clip(pieces.get(r, []), lo, hi)
            per[r]["busy"] += sum(e - s for s, e in mine)
            per[r]["window"] += hi - lo
            for phase, s, e in _gaps(mine, lo, hi):
                per[r][phase] += e - s
                bubble_rows.append(
                    {
                        "rank": r,
                        "stage": stage_of_rank[r],
                        "step": step,
                        "phase": phase,
                        "start_ns": s,
                        "end_ns": e,
                    }
                )
    return per, bubble_rows


def span_busy(
    events: pl.DataFrame, windows: pl.DataFrame, pieces: Pieces, ranks: list[int]
) -> tuple[int, dict[int, int]]:
    """(the profiled span of the pipeline ranks in ns, busy ns of each rank in it: its compute
    and its weight updates)."""
    wins = windows.filter(pl.col("rank").is_in(ranks))
    span_lo, span_hi = int(wins["start_ns"].min()), int(wins["end_ns"].max())
    updates = events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("kind") == "annotation")
        & pl.col("name").str.contains(UPDATE)
        & pl.col("rank").is_in(ranks)
    )
    upd = defaultdict(list)
    for r, s, e in updates.select("rank", "start_ns", "end_ns").iter_rows():
        upd[r].append((s, e))
    busy_ns = {}
    for r in ranks:
        busy = _clip(sorted(pieces.get(r, []) + upd[r]), span_lo, span_hi)
        busy_ns[r] = sum(e - s for s, e in busy)
    return span_hi - span_lo, busy_ns


def _clip(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for s, e in pieces:
        s, e = max(s, lo), min(e, hi)
        if e > s:
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
    return out


def _gaps(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """Bubble intervals of one stage in [lo, hi): fill, steady gaps, drain."""
    if not pieces:
        return [("fill", lo, hi)] if hi > lo else []
    out = []
    if pieces[0][0] > lo:
        out.append(("fill", lo, pieces[0][0]))
    out += [("steady", a[1], b[0]) for a, b in zip(pieces, pieces[1:]) if b[0] > a[1]]
    if pieces[-1][1] < hi:
        out.append(("drain", pieces[-1][1], hi))
    return out
