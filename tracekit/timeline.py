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

STEP_PATTERN = r"^ProfilerStep#(\d+)$"
RUNLOOP_THREAD = "pt_gloo_runloop"
SETS = ("compute", "comm", "other", "excluded", "waitlabel", "inner")  # see _cpu_intervals
STATES = ("compute", "overlap", "comm", "other", "idle")  # overlap = compute and comm together


def step_markers(events: pl.DataFrame) -> pl.DataFrame:
    """ProfilerStep#N markers per rank: rank, step, start_ns, end_ns (sorted)."""
    return (
        # starts_with first: a prefix test on every row is ~10x cheaper than the regex
        events.select("rank", "device", "name", "start_ns", "end_ns")
        .filter(pl.col("name").str.starts_with("ProfilerStep#"))
        .filter(pl.col("name").str.contains(STEP_PATTERN) & (pl.col("device") == "cpu"))
        .select(
            "rank",
            pl.col("name").str.extract(STEP_PATTERN).cast(pl.Int32).alias("step"),
            "start_ns",
            "end_ns",
        )
        .unique(["rank", "step"], keep="first")
        .sort("rank", "start_ns")
    )


def runloop_threads(events: pl.DataFrame) -> pl.DataFrame:
    """(rank, pid, tid) of gloo runloop threads: named so, or carrying only gloo collective spans."""
    cpu = events.filter(pl.col("device") == "cpu")
    named = cpu.filter(pl.col("thread_name").fill_null("").str.contains(RUNLOOP_THREAD))
    is_gloo_coll = pl.col("name").str.starts_with("gloo:") & ~pl.col("name").is_in(
        ["gloo:send", "gloo:recv"]
    )
    unnamed = (
        cpu.filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]))
        .group_by("rank", "pid", "tid")
        .agg(
            is_gloo_coll.any().alias("has_gloo"),
            (pl.col("cat") == "cpu_op").any().alias("has_ops"),
        )
        .filter(pl.col("has_gloo") & ~pl.col("has_ops"))
    )
    return pl.concat(
        [named.select("rank", "pid", "tid"), unnamed.select("rank", "pid", "tid")]
    ).unique()


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


def _gpu_intervals(events: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """GPU events of GPU ranks, HTA's cut-short-step rule applied, with their set.

    A GPU rank on gloo has no communication kernels: gloo moves the bytes from host threads,
    so its ``gloo:*`` spans are that rank's communication (else the GPU would look idle).
    """
    gloo_spans = (
        (pl.col("device") == "cpu")
        & (pl.col("cat") == "user_annotation")
        & (pl.col("kind") == "communication")
    )
    gpu = events.filter(
        (
            (pl.col("device") == "gpu")
            & pl.col("kind").is_in(["compute", "communication", "memory", "sync"])
        )
        | gloo_spans
    )
    cut = windows.filter(pl.col("cutoff_ns").is_not_null()).select("rank", "cutoff_ns")
    if cut.height:
        launches = (
            events.filter((pl.col("device") == "cpu") & pl.col("correlation").is_not_null())
            .join(cut, on="rank")
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
    """The ops that start and end inside one of the labels on the same thread."""
    if labels.height == 0 or ops.height == 0:
        return ops.head(0)
    lab = labels.select(
        "rank", "pid", "tid", pl.col("start_ns").alias("l0"), pl.col("end_ns").alias("l1")
    )
    # labels are few (tens per step): an equi-join on the thread, then the containment filter
    inside = ops.join(lab, on=["rank", "pid", "tid"]).filter(
        (pl.col("start_ns") >= pl.col("l0")) & (pl.col("end_ns") <= pl.col("l1"))
    )
    return inside.select(ops.columns).unique()


def _cpu_intervals(events: pl.DataFrame) -> pl.DataFrame:
    """CPU intervals of CPU-only ranks with their set.

    compute: cpu_ops on compute threads; comm: gloo spans and c10d calls; excluded: time inside
    communication calls; waitlabel/inner: communication labels (WAIT_LABELS) and the ops nested
    in them — time inside such a label not under a nested op is waiting, not compute.
    """
    cpu = events.filter(pl.col("device") == "cpu")
    loops = runloop_threads(cpu).with_columns(pl.lit(True).alias("runloop"))
    cpu = cpu.join(loops, on=["rank", "pid", "tid"], how="left").with_columns(
        pl.col("runloop").fill_null(False)
    )
    is_comm_call = (pl.col("cat") == "cpu_op") & (pl.col("kind") == "communication")
    ops = cpu.filter((pl.col("cat") == "cpu_op") & ~pl.col("runloop"))
    compute = ops.filter(pl.col("kind") == "compute").with_columns(pl.lit("compute").alias("set"))
    comm = cpu.filter(
        ((pl.col("cat") == "user_annotation") & (pl.col("kind") == "communication")) | is_comm_call
    ).with_columns(pl.lit("comm").alias("set"))
    excluded = cpu.filter(is_comm_call).with_columns(pl.lit("excluded").alias("set"))
    # gloo p2p spans sit on the calling thread and last from isend/irecv to wait(): compute
    # ops inside them run while the message is in flight; the rest of the span is waiting
    wait_labels = cpu.filter(
        (pl.col("cat") == "user_annotation")
        & ~pl.col("runloop")
        & (pl.col("name").str.contains(WAIT_LABELS) | (pl.col("kind") == "communication"))
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


def intervals(events: pl.DataFrame, windows: pl.DataFrame, gpu_ranks: set[int]) -> pl.DataFrame:
    """All classified intervals, clipped to each rank's window: rank, start_ns, end_ns, set."""
    is_gpu = pl.col("rank").is_in(sorted(gpu_ranks))
    parts = []
    if gpu_ranks:
        parts.append(_gpu_intervals(events.select(_GPU_COLUMNS).filter(is_gpu), windows))
    cpu = events.select(_CPU_COLUMNS).filter(~is_gpu)
    if cpu.height:
        parts.append(_cpu_intervals(cpu))
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
