"""summary.json ``overlap``: how much of each all-gather and reduce-scatter hides under compute.

ZeRO-3 and FSDP trade memory for communication: every unit's parameters are all-gathered before
its forward and again before its backward, and its gradients reduce-scattered after. Whether that
costs time depends on overlap: a gather launched early (prefetch) runs while the previous unit
computes. For every all-gather and reduce-scatter call on every rank (SectionInput.collectives):

- its **interval** is the transfer: the ``gloo:*`` span on the runloop thread (GPU: the NCCL
  kernel), as the collectives table paired it with its call;
- it is attributed to a **unit** and **phase** from the labels around its *call* on the calling
  thread (CPU: the paired ``c10d::`` call; GPU: the kernel's launch, found by correlation id):

  ===================================  ===========================  ==========================
  label around the call                unit                         phase
  ===================================  ===========================  ==========================
  ``comm:all_gather:unit3:fwd``        unit3 (ours: ZeRO-3)         fwd (the qualifier)
  ``comm:reduce_scatter:bucket2``      bucket2 (ZeRO-2)             bwd (a gradient reduce)
  ``comm:all_gather:params``           params (ZeRO-1)              from the phase label, else
                                                                    ``step`` (after the update)
  ``FSDP::all_gather (blocks.3)``      blocks.3 (FSDP2; no name:    from the FSDP hook around
                                       ``root``)                    it: pre/post_forward and
                                                                    forward_prefetch -> fwd,
                                                                    pre/post_backward* and
                                                                    backward_prefetch -> bwd
  ``FSDP::post_backward_reduce (x)``   x                            bwd
  ===================================  ===========================  ==========================

  Otherwise the phase comes from our phase labels (``forward`` -> fwd, ``backward`` -> bwd),
  and a call without any of these labels is unit ``unlabelled`` (with a warning);
- **hidden** = |interval ∩ compute of that rank| (the timeline's segments in state compute or
  overlap), **exposed** = duration - hidden. On CPU ranks, time inside a wait label
  (``comm:wait:*``, FSDP2's ``FSDP::*_wait*``) is taken out of compute first: a backward hook that
  blocks on a gather runs inside an ``autograd::engine::evaluate_function`` op, which the
  timeline counts as compute although the thread only waits.

Summary: ``allgather_s`` / ``reducescatter_s`` are each rank's total time in those transfers over
the window, averaged over ranks (so comparable with ``ranks[].comm_s``), with their hidden and
exposed parts and ``*_hidden_fraction`` = hidden / duration over all ranks. ``per_layer[]``: one
row per (unit, phase, op) in order of first appearance: ``count`` (calls over all ranks and
steps), ``duration_s``, ``hidden_s``, ``exposed_s`` (per rank over the window, averaged over ranks)
and ``hidden_fraction``. Frame ``overlap_units``: one row per call per rank. None when the trace
has no all-gather or reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import msgspec
import polars as pl

from tracekit import labels
from tracekit.analyses.section import SectionInput, SectionResult
from tracekit.summary.memory import Overlap, OverlapLayer

OPS = ("all_gather", "reduce_scatter")
COMPUTE_STATES = ("compute", "overlap")
UNLABELLED = "unlabelled"
# FSDP2 (torch.distributed.fsdp.fully_shard) record_function names, with "(<module fqn>)" appended
FSDP_SITE = r"^FSDP::(all_gather|post_backward_reduce|reduce_scatter)(?: \((?P<fqn>[^)]*)\))?$"
FSDP_HOOK = r"^FSDP::(pre_forward|post_forward|forward_prefetch|pre_backward|post_backward|backward_prefetch)"
WAIT_LABEL = r"^comm:wait:|^FSDP::\w*_wait"
FRAME_SCHEMA = {
    "rank": pl.Int32,
    "unit": pl.Utf8,
    "phase": pl.Utf8,
    "op": pl.Utf8,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "duration_s": pl.Float64,
    "hidden_s": pl.Float64,
    "exposed_s": pl.Float64,
    "bytes": pl.Int64,
    "label": pl.Utf8,
}


# --- where each collective was called from -----------------------------------------------------


def _call_sites(events: pl.DataFrame, coll: pl.DataFrame) -> pl.DataFrame:
    """coll + call_pid, call_tid, call_ns: the thread and time of the call that issued each row.

    CPU: the ``c10d::`` cpu_op the collectives table paired with the span (call_start_ns).
    GPU: the kernel's CPU launch (same correlation id) on the launching thread.
    """
    cpu_calls = (
        events.filter((pl.col("cat") == "cpu_op") & (pl.col("kind") == "communication"))
        .select(
            "rank",
            pl.col("start_ns").alias("call_start_ns"),
            pl.col("pid").alias("call_pid"),
            pl.col("tid").alias("call_tid"),
        )
        .unique(["rank", "call_start_ns"], keep="first")
    )
    kernels = (
        events.filter((pl.col("device") == "gpu") & (pl.col("kind") == "communication"))
        .select("rank", "start_ns", "end_ns", "correlation")
        .unique(["rank", "start_ns", "end_ns"], keep="first")
    )
    launches = (
        events.filter(
            (pl.col("device") == "cpu")
            & pl.col("correlation").is_not_null()
            & pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])
        )
        .select(
            "rank",
            "correlation",
            pl.col("start_ns").alias("launch_ns"),
            pl.col("pid").alias("launch_pid"),
            pl.col("tid").alias("launch_tid"),
        )
        .unique(["rank", "correlation"], keep="first")
    )
    if "call_start_ns" not in coll.columns:  # a table without the CPU pairing (GPU only)
        coll = coll.with_columns(pl.lit(None, dtype=pl.Int64).alias("call_start_ns"))
    return (
        coll.join(cpu_calls, on=["rank", "call_start_ns"], how="left")
        .join(kernels, on=["rank", "start_ns", "end_ns"], how="left")
        .join(launches, on=["rank", "correlation"], how="left")
        .with_columns(
            pl.coalesce("call_start_ns", "launch_ns").alias("call_ns"),
            pl.coalesce("call_pid", "launch_pid").alias("call_pid"),
            pl.coalesce("call_tid", "launch_tid").alias("call_tid"),
        )
        .drop("launch_ns", "launch_pid", "launch_tid", "correlation")
    )


def _innermost(calls: pl.DataFrame, spans: pl.DataFrame, prefix: str) -> pl.DataFrame:
    """For each call, the latest-starting span of ``spans`` on its thread that still encloses it:
    columns ``<prefix>`` (the name) added. Spans of one kind do not nest on a thread (or nest only
    one inside the other, where the inner one is the one wanted), so an as-of join suffices."""
    spans = spans.select(
        pl.col("rank"),
        pl.col("pid").alias("call_pid"),
        pl.col("tid").alias("call_tid"),
        pl.col("start_ns").alias("s_start"),
        pl.col("end_ns").alias("s_end"),
        pl.col("name").alias(prefix),
    ).sort("s_start")
    joined = calls.sort("call_ns").join_asof(
        spans,
        left_on="call_ns",
        right_on="s_start",
        by=["rank", "call_pid", "call_tid"],
        strategy="backward",
        check_sortedness=False,  # both sorted globally on the key
    )
    inside = pl.col("s_end") >= pl.col("call_ns")
    return joined.with_columns(pl.when(inside).then(pl.col(prefix)).alias(prefix)).drop(
        "s_start", "s_end"
    )


def _attribute(events: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Add ``label`` (the site label), ``unit`` and ``phase`` to every call (module docstring)."""
    ann = events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("cat") == "user_annotation")
        & ~pl.col("name").str.starts_with("gloo:")
    )
    name = pl.col("name")
    ours = name.str.contains(r"^comm:(all_gather|reduce_scatter):")
    site = ann.filter(ours | name.str.contains(FSDP_SITE))
    hooks = ann.filter(name.str.contains(FSDP_HOOK))
    phases = ann.filter(
        name.is_in([labels.FORWARD, labels.BACKWARD, labels.OPTIMIZER, labels.ZERO_GRAD])
    )
    calls = calls.with_row_index("_row")
    found = calls.filter(pl.col("call_ns").is_not_null())  # as-of joins need a time
    for spans, column in ((site, "label"), (hooks, "hook"), (phases, "phase_label")):
        found = _innermost(found, spans, column)
    out = calls.join(found.select("_row", "label", "hook", "phase_label"), on="_row", how="left")

    parsed = {
        n: labels.parse(n)
        for n in out["label"].drop_nulls().unique().to_list()
        if n.startswith("comm:")
    }
    our_unit = {n: lab.what for n, lab in parsed.items() if lab is not None}
    our_dir = {
        n: next((q for q in lab.qualifiers if q in (labels.FWD, labels.BWD)), None)
        for n, lab in parsed.items()
        if lab is not None
    }
    fsdp_fqn = pl.col("label").str.extract(FSDP_SITE, 2)
    hook_fqn = pl.coalesce(
        pl.col("hook").str.extract(r"\(([^)]*)\)$", 1),
        pl.col("hook").str.extract(r"_prefetch for (.+)$", 1),
    )
    unit = (
        pl.when(pl.col("label").str.starts_with("comm:"))
        .then(pl.col("label").replace_strict(our_unit, default=None, return_dtype=pl.Utf8))
        .when(pl.col("label").str.starts_with("FSDP::"))
        .then(
            pl.when(fsdp_fqn.is_null() | (fsdp_fqn == "")).then(pl.lit("root")).otherwise(fsdp_fqn)
        )
        .when(pl.col("hook").is_not_null())
        .then(
            pl.when(hook_fqn.is_null() | (hook_fqn == "")).then(pl.lit("root")).otherwise(hook_fqn)
        )
        .otherwise(pl.lit(UNLABELLED))
    )
    hook_dir = (
        pl.when(pl.col("hook").str.contains("backward"))
        .then(pl.lit(labels.BWD))
        .when(pl.col("hook").str.contains("forward"))
        .then(pl.lit(labels.FWD))
    )
    phase_dir = (
        pl.when(pl.col("phase_label") == labels.FORWARD)
        .then(pl.lit(labels.FWD))
        .when(pl.col("phase_label") == labels.BACKWARD)
        .then(pl.lit(labels.BWD))
    )
    phase = (
        pl.when(pl.col("op") == "reduce_scatter")
        .then(pl.lit(labels.BWD))  # a gradient reduce
        .otherwise(
            pl.coalesce(
                pl.col("label").replace_strict(our_dir, default=None, return_dtype=pl.Utf8),
                hook_dir,
                phase_dir,
                pl.lit("step"),
            )
        )
    )
    return out.with_columns(unit.alias("unit"), phase.alias("phase")).drop(
        "_row", "hook", "phase_label"
    )


# --- hidden under compute ----------------------------------------------------------------------


def compute_intervals(
    segments: pl.DataFrame, events: pl.DataFrame, gpu_ranks: Set[int] = frozenset()
) -> pl.DataFrame:
    """Disjoint compute intervals per rank (rank, start_ns, end_ns): the timeline's compute and
    overlap segments, minus wait labels on CPU ranks (module docstring)."""
    comp = segments.filter(pl.col("state").is_in(COMPUTE_STATES)).select(
        "rank", "start_ns", "end_ns"
    )
    waits = events.filter(
        (pl.col("device") == "cpu")
        & (pl.col("cat") == "user_annotation")
        & pl.col("name").str.contains(WAIT_LABEL)
        & ~pl.col("rank").is_in(sorted(gpu_ranks))
    )
    if waits.height == 0 or comp.height == 0:
        return comp
    edges = pl.concat(
        [
            comp.select(
                "rank", pl.col("start_ns").alias("t"), pl.lit(1).alias("dc"), pl.lit(0).alias("dw")
            ),
            comp.select(
                "rank", pl.col("end_ns").alias("t"), pl.lit(-1).alias("dc"), pl.lit(0).alias("dw")
            ),
            waits.select(
                "rank", pl.col("start_ns").alias("t"), pl.lit(0).alias("dc"), pl.lit(1).alias("dw")
            ),
            waits.select(
                "rank", pl.col("end_ns").alias("t"), pl.lit(0).alias("dc"), pl.lit(-1).alias("dw")
            ),
        ]
    )
    return (
        edges.group_by("rank", "t")
        .agg(pl.col("dc").sum(), pl.col("dw").sum())
        .sort("rank", "t")
        .with_columns(
            pl.col("dc").cum_sum().over("rank").alias("nc"),
            pl.col("dw").cum_sum().over("rank").alias("nw"),
            pl.col("t").shift(-1).over("rank").alias("end_ns"),
        )
        .filter((pl.col("nc") > 0) & (pl.col("nw") <= 0) & pl.col("end_ns").is_not_null())
        .select("rank", pl.col("t").alias("start_ns"), "end_ns")
    )


def _compute_before(points: pl.DataFrame, col: str, compute: pl.DataFrame) -> pl.DataFrame:
    """points + ``<col>_c``: compute time on the rank from its window start up to points[col]."""
    comp = (
        compute.select(
            "rank",
            pl.col("start_ns").alias("c_start"),
            (pl.col("end_ns") - pl.col("start_ns")).alias("c_len"),
        )
        .sort("rank", "c_start")
        .with_columns((pl.col("c_len").cum_sum().over("rank") - pl.col("c_len")).alias("c_before"))
        .sort("c_start")
    )
    joined = points.sort(col).join_asof(
        comp,
        left_on=col,
        right_on="c_start",
        by="rank",
        strategy="backward",
        check_sortedness=False,
    )  # sorted globally above
    inside = pl.min_horizontal(
        pl.max_horizontal(pl.col(col) - pl.col("c_start"), pl.lit(0)), pl.col("c_len")
    )
    return joined.with_columns(
        pl.when(pl.col("c_start").is_null())
        .then(pl.lit(0, dtype=pl.Int64))
        .otherwise(pl.col("c_before") + inside)
        .alias(f"{col}_c")
    ).drop("c_start", "c_len", "c_before")


def overlap_units(
    events: pl.DataFrame,
    coll: pl.DataFrame,
    segments: pl.DataFrame,
    gpu_ranks: Set[int] = frozenset(),
) -> pl.DataFrame:
    """One row per all-gather / reduce-scatter per rank: FRAME_SCHEMA columns."""
    rows = coll.filter(pl.col("op").is_in(OPS))
    if rows.height == 0:
        return pl.DataFrame(schema=FRAME_SCHEMA)
    rows = _attribute(events, _call_sites(events, rows))
    compute = compute_intervals(segments, events, gpu_ranks)
    rows = _compute_before(rows, "start_ns", compute)
    rows = _compute_before(rows, "end_ns", compute)
    hidden = (pl.col("end_ns_c") - pl.col("start_ns_c")).clip(lower_bound=0) * 1e-9
    duration = (pl.col("end_ns") - pl.col("start_ns")) * 1e-9
    return (
        rows.with_columns(duration.alias("duration_s"), hidden.alias("hidden_s"))
        .with_columns(pl.min_horizontal("hidden_s", "duration_s").alias("hidden_s"))
        .with_columns((pl.col("duration_s") - pl.col("hidden_s")).alias("exposed_s"))
        .select([pl.col(c).cast(t) for c, t in FRAME_SCHEMA.items()])
        .sort("rank", "start_ns")
    )


# --- the section -------------------------------------------------------------------------------


def _totals(frame: pl.DataFrame, op: str, n_ranks: int) -> dict[str, Any]:
    sub = frame.filter(pl.col("op") == op)
    dur, hid = float(sub["duration_s"].sum()), float(sub["hidden_s"].sum())
    return {
        "s": dur / n_ranks,
        "hidden_s": hid / n_ranks,
        "exposed_s": (dur - hid) / n_ranks,
        "hidden_fraction": hid / dur if dur > 0 else None,
        "count": sub.height,
    }


def overlap_summary(frame: pl.DataFrame, n_ranks: int, steps: int) -> Overlap | None:
    """summary.json ``overlap`` from the overlap_units frame (None when it is empty)."""
    if frame.height == 0:
        return None
    n_ranks = max(n_ranks, 1)
    per_layer = (
        frame.group_by("unit", "phase", "op")
        .agg(
            pl.len().alias("count"),
            pl.col("duration_s").sum(),
            pl.col("hidden_s").sum(),
            pl.col("exposed_s").sum(),
            pl.col("start_ns").min().alias("first"),
        )
        .sort("first")
        .with_columns(
            pl.when(pl.col("duration_s") > 0)
            .then(pl.col("hidden_s") / pl.col("duration_s"))
            .alias("hidden_fraction"),
            *[(pl.col(c) / n_ranks) for c in ("duration_s", "hidden_s", "exposed_s")],
        )
        .drop("first")
    )
    ag, rs = _totals(frame, "all_gather", n_ranks), _totals(frame, "reduce_scatter", n_ranks)
    return Overlap(
        ranks=n_ranks,
        steps=steps,
        allgather_count=ag["count"],
        allgather_s=ag["s"],
        allgather_hidden_s=ag["hidden_s"],
        allgather_exposed_s=ag["exposed_s"],
        allgather_hidden_fraction=ag["hidden_fraction"],
        reducescatter_count=rs["count"],
        reducescatter_s=rs["s"],
        reducescatter_hidden_s=rs["hidden_s"],
        reducescatter_exposed_s=rs["exposed_s"],
        reducescatter_hidden_fraction=rs["hidden_fraction"],
        per_layer=msgspec.convert(per_layer.to_dicts(), list[OverlapLayer], strict=True),
    )


def overlap(inp: SectionInput) -> SectionResult[Overlap]:
    """The ``overlap`` section: its summary value, frame ``overlap_units`` and warnings."""
    frame = inp.per_rank.overlap_units  # overlap_units, computed per rank by the map
    if frame.height == 0:
        return SectionResult()
    warnings = []
    unlabelled = frame.filter(pl.col("unit") == UNLABELLED).height
    if unlabelled:
        warnings.append(
            f"overlap: {unlabelled} all-gather/reduce-scatter calls have no unit label "
            "(comm:<op>:<unit> or FSDP::*) around them; shown as unit 'unlabelled'"
        )
    return SectionResult(
        overlap_summary(frame, frame["rank"].n_unique(), inp.steps),
        {"overlap_units": frame},
        warnings,
    )
