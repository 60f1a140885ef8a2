"""Events -> per-rank timeline: the analysis window, the interval sets, and their algebra.

Which events count (docs/metrics.md "Per rank"):
- GPU traces: GPU events only, as HolisticTraceAnalysis does. compute = non-communication kernels,
  communication = nccl/rccl kernels, other = memcpy/memset/sync.
- CPU traces: compute = ``cpu_op`` events on the rank's compute threads (every thread that is not
  a gloo runloop thread), minus the time inside communication calls (``c10d::*``) and their
  waits; communication = ``gloo:*`` spans (runloop threads, and p2p on the calling thread) plus
  the ``c10d::*`` calls themselves.

The window is the complete steps: ``ProfilerStep#N`` markers. On GPU the last step is usually cut
short (kernels still queued when the profiler stops), so, as HTA does, only kernels launched by
CPU events that start before the last marker are kept. On CPU every op is synchronous: a step's
marker closes after its work, so every marked step is complete. Without markers the window is
the whole trace.

The algebra is one sweep: every interval contributes +1 at its start and -1 at its end to the
counter of its set; a cumulative sum gives, for every elementary segment between two boundaries,
how many intervals of each set cover it. Any union, intersection or difference is then a filter
on those counts and a sum of segment lengths, all in polars.
"""

from __future__ import annotations

import polars as pl

from tracekit import p2p_time
from tracekit.gloo_threads import NAMED_RUNLOOP, with_runloop

STEP_PATTERN = r"^ProfilerStep#(\d+)$"
SETS = ("compute", "comm", "other", "excluded", "waitlabel", "inner")  # see _cpu_intervals
STATES = ("compute", "overlap", "comm", "other", "idle")  # overlap = compute and comm together


def _marker_rows(events: pl.DataFrame) -> pl.DataFrame:
    """Every ProfilerStep#N row: rank, step (Int64; null when N does not fit), name, times."""
    return (
        # starts_with first: a prefix test on every row is ~10x cheaper than the regex
        events.select("rank", "device", "name", "start_ns", "end_ns")
        .filter(pl.col("name").str.starts_with("ProfilerStep#"))
        .filter(pl.col("name").str.contains(STEP_PATTERN) & (pl.col("device") == "cpu"))
        .select(
            "rank",
            # a step number is data: any length of digits; past Int64 it is null, not an error
            pl.col("name").str.extract(STEP_PATTERN).cast(pl.Int64, strict=False).alias("step"),
            "name",
            "start_ns",
            "end_ns",
        )
    )


def step_markers(events: pl.DataFrame) -> pl.DataFrame:
    """ProfilerStep#N markers per rank: rank, step, start_ns, end_ns (sorted).

    Markers whose N does not fit in 64 bits are dropped (marker_warnings says so)."""
    return (
        _marker_rows(events)
        .filter(pl.col("step").is_not_null())
        .drop("name")
        .unique(["rank", "step"], keep="first")
        .sort("rank", "start_ns")
    )


def marker_warnings(events: pl.DataFrame) -> list[str]:
    """One line per rank with ProfilerStep markers whose step number is out of range."""
    bad = (
        _marker_rows(events)
        .filter(pl.col("step").is_null())
        .group_by("rank")
        .agg(pl.len().alias("n"), pl.col("name").first())
        .sort("rank")
    )
    return [
        f"rank {r}: {n} ProfilerStep marker{'s' if n > 1 else ''} with a step number past 64 bits "
        f"(e.g. {name[:60]!r}) dropped"
        for r, n, name in bad.select("rank", "n", "name").iter_rows()
    ]


def analysis_windows(events: pl.DataFrame, gpu_ranks: set[int]) -> pl.DataFrame:
    """One row per rank: rank, kind, steps, start_ns, end_ns, cutoff_ns.

    cutoff_ns (GPU ranks with >= 2 markers) is the start of the last, cut-short step: kernels
    launched after it are dropped. start/end of GPU windows are refined from the kept kernels.
    """
    markers = step_markers(events)
    per_rank = markers.group_by("rank").agg(
        pl.len().alias("n"),
        pl.col("start_ns").min().alias("first_start"),
        pl.col("start_ns").max().alias("last_start"),
        pl.col("end_ns").max().alias("last_end"),
    )
    rows = []
    ranks = events.get_column("rank").unique().sort().to_list()
    by_rank = {r["rank"]: r for r in per_rank.iter_rows(named=True)}
    bounds = (
        events.select("rank", "kind", "start_ns", "end_ns")  # filter copies these 4, not all 20
        .filter(pl.col("kind").is_in(["compute", "communication", "memory", "sync"]))
        .group_by("rank")
        .agg(pl.col("start_ns").min().alias("lo"), pl.col("end_ns").max().alias("hi"))
    )
    lo_hi = {r["rank"]: (r["lo"], r["hi"]) for r in bounds.iter_rows(named=True)}
    for rank in ranks:
        m = by_rank.get(rank)
        lo, hi = lo_hi.get(rank, (None, None))
        if rank in gpu_ranks:
            if m and m["n"] >= 2:
                rows.append((rank, "complete_steps", m["n"] - 1, None, None, m["last_start"]))
            else:
                rows.append((rank, "whole_trace", 0 if not m else m["n"], None, None, None))
        elif m and m["n"] >= 1:
            rows.append((rank, "complete_steps", m["n"], m["first_start"], m["last_end"], None))
        else:
            rows.append((rank, "whole_trace", 0, lo, hi, None))
    return pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int32,
            "kind": pl.Utf8,
            "steps": pl.Int32,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "cutoff_ns": pl.Int64,
        },
        orient="row",
    )


def _gpu_intervals(events: pl.DataFrame, windows: pl.DataFrame, gloo: pl.DataFrame) -> pl.DataFrame:
    """GPU events of GPU ranks, HTA's cut-short-step rule applied, with their set.

    A GPU rank on gloo has no communication kernels: gloo moves the bytes from host threads,
    so its ``gloo:*`` spans (``gloo``: rank, start_ns, end_ns; p2p ones with a known peer as
    their transfer and blocked wait) are that rank's communication (else the GPU would look
    idle).
    """
    gpu = pl.concat(
        [
            events.filter(
                (pl.col("device") == "gpu")
                & pl.col("kind").is_in(["compute", "communication", "memory", "sync"])
            ),
            gloo.select(
                pl.col("rank").cast(events.schema["rank"]),
                pl.lit("cpu").alias("device"),
                pl.lit("user_annotation").alias("cat"),
                pl.lit("communication").alias("kind"),
                pl.col("start_ns").cast(pl.Int64),
                pl.col("end_ns").cast(pl.Int64),
                pl.lit(None, events.schema["correlation"]).alias("correlation"),
            ),
        ],
        how="diagonal_relaxed",
    )
    cut = windows.filter(pl.col("cutoff_ns").is_not_null()).select("rank", "cutoff_ns")
    if cut.height:
        launch = (pl.col("device") == "cpu") & pl.col("correlation").is_not_null()
        launches = (  # the three columns needed: a filter of every column took 450 MB (#29)
            events.select("rank", "correlation", "start_ns", launch.alias("_l"))
            .filter("_l")
            .join(cut, on="rank", maintain_order="left")
            .select("rank", "correlation", (pl.col("start_ns") < pl.col("cutoff_ns")).alias("keep"))
            .unique(["rank", "correlation"], keep="first")
        )
        gpu = gpu.join(cut, on="rank", how="left").join(
            launches, on=["rank", "correlation"], how="left"
        )
        gpu = gpu.filter(
            pl.col("cutoff_ns").is_null()
            | pl.col("keep").fill_null(False)
            | ((pl.col("device") == "cpu") & (pl.col("start_ns") < pl.col("cutoff_ns")))
        )
    return gpu.select(
        "rank",
        "start_ns",
        "end_ns",
        pl.col("kind")
        .replace_strict(
            {"compute": "compute", "communication": "comm", "memory": "other", "sync": "other"}
        )
        .alias("set"),
    )


# Labels inside which the compute thread waits for communication: ours (comm:*) and FSDP2's.
# On gloo a blocking wait leaves no event of its own; inside backward it sits within an
# ``autograd::engine::evaluate_function`` op, which would otherwise count it as compute.
WAIT_LABELS = r"^comm:|^FSDP::(all_gather|pre_forward|pre_backward|post_backward_reduce|post_backward_rs_wait)"


def _ops_inside(ops: pl.DataFrame, labels: pl.DataFrame) -> pl.DataFrame:
    """The ops that start and end inside one of the labels on the same thread.

    An op is inside some label iff, among the thread's labels starting at or before the op,
    the latest end reaches the op's end: a running maximum of label ends over labels sorted by
    start, read by one as-of join per op. Linear after the sort (a join of every op with every
    label of its thread grew with the square of the trace).
    """
    if labels.height == 0 or ops.height == 0:
        return ops.head(0)
    keys = ["rank", "pid", "tid"]
    reach = (
        labels.select(*keys, pl.col("start_ns").alias("l0"), pl.col("end_ns").alias("l1"))
        .sort(*keys, "l0")
        .with_columns(pl.col("l1").cum_max().over(keys).alias("reach"))
        .select(*keys, "l0", "reach")
        .sort("l0")
    )
    inside = (
        ops.sort("start_ns")
        .join_asof(
            reach,
            left_on="start_ns",
            right_on="l0",
            by=keys,
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("reach") >= pl.col("end_ns"))
    )
    return inside.select(ops.columns)


def _split_p2p(
    cpu: pl.DataFrame, p2p: pl.DataFrame | None, keep: pl.Expr | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(communication spans with ``split``: a p2p span whose peer is known, counted by its
    transfer and blocked wait instead of whole; those parts as rank, start_ns, end_ns).
    ``keep``: the rows of ``cpu`` to look at (all without)."""
    keep = pl.lit(True) if keep is None else keep
    spans = cpu.filter(
        keep & (pl.col("cat") == "user_annotation") & (pl.col("kind") == "communication")
    )
    keys = ["rank", "pid", "tid", "start_ns", "end_ns"]
    m = p2p_time.matched(spans.filter(p2p_time.p2p_spans(spans)), p2p)
    spans = spans.join(
        m.select(keys).unique().with_columns(pl.lit(True).alias("split")), on=keys, how="left"
    ).with_columns(pl.col("split").fill_null(False))
    if m.height == 0:  # nothing to cut: no ops needed
        return spans, p2p_time.comm_parts(m, cpu.select(_OP_COLUMNS).head(0))
    mask = cpu.select(keep & (pl.col("cat") == "cpu_op") & ~pl.col("runloop")).to_series()
    return spans, p2p_time.comm_parts(m, cpu.select(_OP_COLUMNS).filter(mask))


def _cpu_intervals(events: pl.DataFrame, p2p: pl.DataFrame | None = None) -> pl.DataFrame:
    """CPU intervals of CPU-only ranks with their set.

    compute: cpu_ops on compute threads; comm: gloo spans (p2p ones with a known peer: their
    transfer and blocked wait, tracekit.p2p_time) and c10d calls; excluded: time inside
    communication calls; waitlabel/inner: communication labels (WAIT_LABELS) and the ops nested
    in them — time inside such a label not under a nested op is waiting, not compute.
    """
    cpu = with_runloop(_rows(events, pl.col("device") == "cpu"))
    is_comm_call = (pl.col("cat") == "cpu_op") & (pl.col("kind") == "communication")
    # the ops need no names: filtered with them, the text columns were copied for every op
    ops = cpu.select(_OP_COLUMNS).filter((pl.col("cat") == "cpu_op") & ~pl.col("runloop"))
    compute = ops.filter(pl.col("kind") == "compute").with_columns(pl.lit("compute").alias("set"))
    spans, parts = _split_p2p(cpu, p2p)
    comm = pl.concat(
        [
            spans.filter(~pl.col("split")).select("rank", "start_ns", "end_ns"),
            cpu.filter(is_comm_call).select("rank", "start_ns", "end_ns"),
            parts,
        ]
    ).with_columns(pl.lit("comm").alias("set"))
    excluded = cpu.filter(is_comm_call).with_columns(pl.lit("excluded").alias("set"))
    # a gloo p2p span whose peer is unknown counts whole, as a label: compute ops inside it run
    # while the message is in flight; the rest of the span is waiting
    wait_labels = pl.concat(
        [
            cpu.filter(
                (pl.col("cat") == "user_annotation")
                & ~pl.col("runloop")
                & pl.col("name").str.contains(WAIT_LABELS)
                & (pl.col("kind") != "communication").fill_null(True)
            ).select("rank", "pid", "tid", "start_ns", "end_ns"),
            spans.filter(~pl.col("runloop") & ~pl.col("split")).select(
                "rank", "pid", "tid", "start_ns", "end_ns"
            ),
        ]
    )
    inner = _ops_inside(compute, wait_labels).with_columns(pl.lit("inner").alias("set"))
    return pl.concat(
        [
            f.select("rank", "start_ns", "end_ns", "set")
            for f in (
                compute,
                comm,
                excluded,
                wait_labels.with_columns(pl.lit("waitlabel").alias("set")),
                inner,
            )
        ]
    )


def _rows(frame: pl.DataFrame, keep: pl.Expr) -> pl.DataFrame:
    """``frame.filter(keep)``, the frame itself when every row is kept (a filter copies)."""
    mask = frame.select(keep.fill_null(False)).to_series()
    return frame if mask.all() else frame.filter(mask)


_OP_COLUMNS = ("rank", "pid", "tid", "cat", "kind", "start_ns", "end_ns", "runloop")

# The columns each side of the timeline reads. Filtering a projection copies these, not all 20
# columns of the events table (at 650k events: a third of the time and memory of the filters).
_GPU_COLUMNS = ("rank", "device", "cat", "kind", "start_ns", "end_ns", "correlation")
_CPU_COLUMNS = (
    "rank",
    "device",
    "pid",
    "tid",
    "thread_name",
    "cat",
    "name",
    "kind",
    "start_ns",
    "end_ns",
)


def _cpu_columns(events: pl.DataFrame) -> list[str]:
    """_CPU_COLUMNS, with the runloop flag in place of the thread name where the events have it."""
    named = NAMED_RUNLOOP in events.columns
    return [NAMED_RUNLOOP if c == "thread_name" and named else c for c in _CPU_COLUMNS]


def intervals(
    events: pl.DataFrame,
    windows: pl.DataFrame,
    gpu_ranks: set[int],
    p2p: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """All classified intervals, clipped to each rank's window: rank, start_ns, end_ns, set.

    ``p2p``: the matched collectives table (tracekit.analyses.collectives.raw_collectives);
    it pairs each gloo send with its receive so that a p2p span counts only its transfer and
    blocked wait (tracekit.p2p_time). Without it every p2p span counts whole.
    """
    is_gpu = pl.col("rank").is_in(sorted(gpu_ranks))
    parts = []
    if gpu_ranks:
        # the host rows are picked inside: a filtered copy of them held every CPU event's text
        host = with_runloop(events.select(_cpu_columns(events)))
        spans, split = _split_p2p(host, p2p, is_gpu & (pl.col("device") == "cpu"))
        gloo = pl.concat(
            [spans.filter(~pl.col("split")).select("rank", "start_ns", "end_ns"), split],
            how="vertical_relaxed",
        )
        parts.append(_gpu_intervals(_rows(events.select(_GPU_COLUMNS), is_gpu), windows, gloo))
    cpu = _rows(events.select(_cpu_columns(events)), ~is_gpu)
    if cpu.height:
        parts.append(_cpu_intervals(cpu, p2p))
    if not parts:
        return pl.DataFrame(
            schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "set": pl.Utf8}
        )
    iv = pl.concat(parts)
    return (
        iv.join(
            windows.select("rank", pl.col("start_ns").alias("w0"), pl.col("end_ns").alias("w1")),
            on="rank",
        )
        .with_columns(
            pl.max_horizontal("start_ns", pl.col("w0").fill_null(pl.col("start_ns"))).alias(
                "start_ns"
            ),
            pl.min_horizontal("end_ns", pl.col("w1").fill_null(pl.col("end_ns"))).alias("end_ns"),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .select("rank", "start_ns", "end_ns", "set")
    )


def refine_gpu_windows(
    windows: pl.DataFrame, iv: pl.DataFrame, gpu_ranks: set[int]
) -> pl.DataFrame:
    """GPU window = first kept GPU event start to last kept GPU event end (HTA's span)."""
    if not gpu_ranks:
        return windows
    span = (
        iv.filter(pl.col("rank").is_in(sorted(gpu_ranks)))
        .group_by("rank")
        .agg(pl.col("start_ns").min().alias("lo"), pl.col("end_ns").max().alias("hi"))
    )
    return (
        windows.join(span, on="rank", how="left")
        .with_columns(
            pl.when(pl.col("rank").is_in(sorted(gpu_ranks)))
            .then(pl.col("lo"))
            .otherwise(pl.col("start_ns"))
            .alias("start_ns"),
            pl.when(pl.col("rank").is_in(sorted(gpu_ranks)))
            .then(pl.col("hi"))
            .otherwise(pl.col("end_ns"))
            .alias("end_ns"),
        )
        .drop("lo", "hi")
    )


def segments(iv: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Elementary segments of each rank's window with how many intervals of each set cover them.

    Columns: rank, start_ns, end_ns, n_compute, n_comm, n_other, n_excluded, state.
    state: compute (compute, no comm) / overlap (compute and comm) / comm (exposed communication)
    / other / idle. compute is "covered by a compute op and not inside a comm call".
    """
    edges = pl.concat(
        [
            iv.select("rank", pl.col("start_ns").alias("t"), "set", pl.lit(1, pl.Int32).alias("d")),
            iv.select("rank", pl.col("end_ns").alias("t"), "set", pl.lit(-1, pl.Int32).alias("d")),
            # window bounds as zero-weight edges so leading/trailing idle becomes a segment
            windows.select(
                "rank",
                pl.col("start_ns").alias("t"),
                pl.lit("window").alias("set"),
                pl.lit(0, pl.Int32).alias("d"),
            ),
            windows.select(
                "rank",
                pl.col("end_ns").alias("t"),
                pl.lit("window").alias("set"),
                pl.lit(0, pl.Int32).alias("d"),
            ),
        ]
    ).filter(pl.col("t").is_not_null())
    counts = (
        edges.group_by("rank", "t")
        .agg([(pl.col("d") * (pl.col("set") == s)).sum().alias(f"d_{s}") for s in SETS])
        .sort("rank", "t")
        .with_columns([pl.col(f"d_{s}").cum_sum().over("rank").alias(f"n_{s}") for s in SETS])
        .with_columns(pl.col("t").shift(-1).over("rank").alias("end_ns"))
        .rename({"t": "start_ns"})
        .filter(pl.col("end_ns").is_not_null() & (pl.col("end_ns") > pl.col("start_ns")))
    )
    counts = counts.join(
        windows.select("rank", pl.col("start_ns").alias("w0"), pl.col("end_ns").alias("w1")),
        on="rank",
    )
    counts = counts.filter(
        (pl.col("start_ns") >= pl.col("w0")) & (pl.col("end_ns") <= pl.col("w1"))
    )
    waiting = (pl.col("n_waitlabel") > 0) & (pl.col("n_inner") <= 0)
    comp = (pl.col("n_compute") > 0) & (pl.col("n_excluded") <= 0) & ~waiting
    comm = pl.col("n_comm") > 0
    return counts.select(
        "rank",
        "start_ns",
        "end_ns",
        *[f"n_{s}" for s in SETS],
        pl.when(comp & comm)
        .then(pl.lit("overlap"))
        .when(comp)
        .then(pl.lit("compute"))
        .when(comm)
        .then(pl.lit("comm"))
        .when(pl.col("n_other") > 0)
        .then(pl.lit("other"))
        .otherwise(pl.lit("idle"))
        .alias("state"),
    )


def merge_states(seg: pl.DataFrame) -> pl.DataFrame:
    """Adjacent segments of one rank with the same state merged: rank, start_ns, end_ns, state."""
    return (
        seg.sort("rank", "start_ns")
        .with_columns(
            (
                (pl.col("state") != pl.col("state").shift(1).over("rank"))
                | (pl.col("start_ns") != pl.col("end_ns").shift(1).over("rank"))
            )
            .fill_null(True)
            .cum_sum()
            .alias("run")
        )
        .group_by("rank", "run")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("state").first())
        .sort("rank", "start_ns")
        .drop("run")
    )
