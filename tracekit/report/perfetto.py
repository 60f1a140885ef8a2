"""One merged Chrome-trace JSON of all ranks, for Perfetto UI (ui.perfetto.dev) and chrome://tracing.

Each rank is a process (``pid`` = rank; with several runs, run i's ranks are ``i * 100000 +
rank``) holding its original events, one thread per original (pid, thread or stream), plus four
tracks built by the analysis, shown first:

- ``compute``        spans where the rank computes (timeline state compute or overlap)
- ``communication``  spans where it communicates (overlap or exposed comm; args say which)
- ``idle``           spans where it does neither
- ``bubble``         pipeline bubbles (fill / steady / drain), when the run has them

``ts`` and ``dur`` are microseconds (floats, nanosecond precision) relative to the earliest
event of all runs written, so every rank shares one clock. The JSON rows are written by polars
(``write_ndjson`` rows joined into one array), never by a Python loop over events; plain events
carry ``kind``/``device`` args, collective ones also ``op``, ``bytes``, ``group``, ``peer``.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import polars as pl

from tracekit import outputs
from tracekit.figures.read import frame

TRACKS = ("compute", "communication", "idle", "bubble")
TRACK_TID = {name: 900_001 + i for i, name in enumerate(TRACKS)}
RUN_PID_STRIDE = 100_000
ARG_COLUMNS = ("kind", "device", "op", "bytes", "dtype", "group", "group_size", "peer")


def _merge_runs(tl: pl.DataFrame, member: pl.Expr) -> pl.DataFrame:
    """Adjacent timeline segments of one rank that are all in a set, merged into spans."""
    t = tl.sort("rank", "start_ns").with_columns(member.alias("_in"))
    t = t.with_columns(
        (
            (pl.col("_in") != pl.col("_in").shift(1).over("rank"))
            | (pl.col("start_ns") != pl.col("end_ns").shift(1).over("rank"))
        )
        .fill_null(True)
        .cum_sum()
        .alias("_run")
    )
    return (
        t.filter(pl.col("_in"))
        .group_by("rank", "_run")
        .agg(
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            (pl.col("state") == "comm").any().alias("exposed"),
        )
        .drop("_run")
    )


def _us(col: str, t0: int) -> pl.Expr:
    return ((pl.col(col) - t0).cast(pl.Float64) / 1000).round(3)


def _dur(t0: int) -> pl.Expr:
    return ((pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64) / 1000).round(3).alias("dur")


def _ndjson_rows(df: pl.DataFrame) -> str:
    """The rows of DF as JSON objects joined by commas (no brackets); '' when empty."""
    if df.height == 0:
        return ""
    buf = io.BytesIO()
    df.write_ndjson(buf)
    return buf.getvalue().decode("utf-8").rstrip("\n").replace("\n", ",")


def _run_parts(
    analysis: Any, pid_base: int, t0: int, label: str | None
) -> tuple[list[str], list[dict]]:
    """(chunks of JSON rows, metadata events) of one analysis."""
    events: pl.DataFrame = analysis.events
    chunks: list[str] = []
    meta: list[dict] = []
    ranks = sorted(set(events.get_column("rank").unique().to_list()))
    tl = frame(analysis, "timeline")
    if tl is not None:
        ranks = sorted(set(ranks) | set(tl.get_column("rank").unique().to_list()))
    host = {
        getattr(i, "rank", None): getattr(i, "host_name", None)
        for i in getattr(analysis, "infos", []) or []
    }
    for r in ranks:
        name = f"rank {r}" + (f" ({host[r]})" if host.get(r) else "")
        if label:
            name = f"{label} · {name}"
        meta.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid_base + int(r),
                "tid": 0,
                "args": {"name": name},
            }
        )
        meta.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid_base + int(r),
                "tid": 0,
                "args": {"sort_index": pid_base + int(r)},
            }
        )
        for track in TRACKS:
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid_base + int(r),
                    "tid": TRACK_TID[track],
                    "args": {"name": f"tracekit: {track}"},
                }
            )
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid_base + int(r),
                    "tid": TRACK_TID[track],
                    "args": {"sort_index": -10 + TRACKS.index(track)},
                }
            )

    if events.height:
        events = events.with_columns(
            pl.col(c).cast(pl.Utf8).fill_null("") for c in ("device", "pid", "tid")
        )
        threads = (
            events.select("rank", "device", "pid", "tid", "thread_name", "stream")
            .unique(["rank", "device", "pid", "tid"], keep="first")
            .sort("rank", "device", "pid", "tid")
            .with_columns(
                pl.int_range(1, pl.len() + 1).over("rank").cast(pl.Int64).alias("tid_out")
            )
        )
        for row in threads.iter_rows(named=True):
            if row["device"] == "gpu":
                tname = f"gpu {row['pid']} stream {row['stream'] if row['stream'] is not None else row['tid']}"
            else:
                tname = row["thread_name"] or f"thread {row['tid']}"
                tname = f"cpu {row['pid']} {tname}"
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid_base + int(row["rank"]),
                    "tid": int(row["tid_out"]),
                    "args": {"name": tname},
                }
            )
        arg_cols = [c for c in ARG_COLUMNS if c in events.columns]
        extra = [c for c in arg_cols if c not in ("kind", "device")]
        ev = events.join(
            threads.select("rank", "device", "pid", "tid", "tid_out"),
            on=["rank", "device", "pid", "tid"],
            how="left",
        )
        has_extra = (
            pl.any_horizontal([pl.col(c).is_not_null() for c in extra]) if extra else pl.lit(False)
        )
        # plain events carry kind and device only; collective ones their op, bytes, group, peer too
        for mask, cols in (
            (~has_extra, [c for c in arg_cols if c in ("kind", "device")]),
            (has_extra, arg_cols),
        ):
            part = ev.filter(mask)
            if part.height == 0:
                continue
            chunks.append(
                _ndjson_rows(
                    part.select(
                        pl.col("name").fill_null(""),
                        pl.col("cat").fill_null(""),
                        pl.lit("X").alias("ph"),
                        _us("start_ns", t0).alias("ts"),
                        _dur(t0),
                        (pl.col("rank").cast(pl.Int64) + pid_base).alias("pid"),
                        pl.col("tid_out").alias("tid"),
                        pl.struct(*cols).alias("args"),
                    )
                )
            )

    if tl is not None and tl.height:
        for track, member in (
            ("compute", pl.col("state").is_in(["compute", "overlap"])),
            ("communication", pl.col("state").is_in(["overlap", "comm"])),
            ("idle", pl.col("state") == "idle"),
        ):
            spans = _merge_runs(tl, member)
            if track == "communication":
                args = pl.struct(pl.col("exposed").alias("exposed_somewhere")).alias("args")
            else:
                args = pl.struct(pl.lit(track).alias("state")).alias("args")
            chunks.append(
                _ndjson_rows(
                    spans.select(
                        pl.lit(track).alias("name"),
                        pl.lit("tracekit").alias("cat"),
                        pl.lit("X").alias("ph"),
                        _us("start_ns", t0).alias("ts"),
                        _dur(t0),
                        (pl.col("rank").cast(pl.Int64) + pid_base).alias("pid"),
                        pl.lit(TRACK_TID[track], pl.Int64).alias("tid"),
                        args,
                    )
                )
            )
    bubbles = frame(analysis, "bubbles")
    if bubbles is not None and bubbles.height:
        extra = [c for c in ("stage", "step", "phase") if c in bubbles.columns]
        chunks.append(
            _ndjson_rows(
                bubbles.select(
                    pl.concat_str(
                        [
                            pl.lit("bubble ("),
                            pl.col("phase").cast(pl.Utf8).fill_null("?"),
                            pl.lit(")"),
                        ]
                    ).alias("name"),
                    pl.lit("tracekit").alias("cat"),
                    pl.lit("X").alias("ph"),
                    _us("start_ns", t0).alias("ts"),
                    _dur(t0),
                    (pl.col("rank").cast(pl.Int64) + pid_base).alias("pid"),
                    pl.lit(TRACK_TID["bubble"], pl.Int64).alias("tid"),
                    pl.struct(*extra).alias("args"),
                )
            )
        )
    return [c for c in chunks if c], meta


def earliest_ns(analyses: Sequence[Any]) -> int:
    starts = []
    for a in analyses:
        if a.events.height:
            starts.append(int(cast(int, a.events.get_column("start_ns").min())))
        tl = frame(a, "timeline")
        if tl is not None and tl.height:
            starts.append(int(cast(int, tl.get_column("start_ns").min())))
    return min(starts) if starts else 0


def write_perfetto(analyses: Sequence[Any], out: Path, labels: Sequence[str] | None = None) -> Path:
    """Write the merged Chrome trace of ANALYSES to OUT (a temporary name, then renamed)."""
    out = Path(out)
    t0 = earliest_ns(analyses)
    several = len(analyses) > 1
    outputs.check_file_target(out, "-o")  # a FIFO, symlink or device is never replaced
    tmp = outputs.temp_name(out)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write('{"displayTimeUnit":"ms","otherData":')
            f.write(
                json.dumps(
                    {
                        "producer": "tracekit",
                        "time_origin_ns": t0,
                        "runs": [str(a.path) for a in analyses],
                    }
                )
            )
            f.write(',"traceEvents":[')
            first = True
            for i, a in enumerate(analyses):
                label = (labels[i] if labels else str(a.path)) if several else None
                chunks, meta = _run_parts(a, i * RUN_PID_STRIDE, t0, label)
                for part in [json.dumps(m) for m in meta] + chunks:
                    if not first:
                        f.write(",")
                    f.write(part)
                    first = False
            f.write("]}\n")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
