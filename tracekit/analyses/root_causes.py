"""Root causes of wait states: Böhme et al.'s delay analysis (ICPP 2010), docs/metrics.md "Why".

A wait of rank w at call c (tracekit.analyses.wait_states) is caused by the last rank d to
arrive. d arrived late because, since the previous synchronisation point that w and d shared
(the last call both were members of; else their window starts), it spent more time than w:
its *excess* per state (compute, transfer, waiting, other, idle; compute split by op name):

    excess_s = max(0, time of d in state s since that point - time of w likewise)

The wait's cost is charged in proportion to the excess, up to the excess itself: the part on
d's own work (compute by op, transfer, other, idle) is a *direct* cost of d; the part on d's own
waiting is *propagated*: d was late because it waited on a third rank, so that share follows the
causes of those waits (computed first: calls in order of their last arrival), to the original
cause. Since d's lateness is ``(d_from - w_from) + (d's time - w's time)``, a wait longer than the
excess is the rest begun later (d left the previous call later): that rest is charged to d as
``late start``. A 17 us op never carries a 190 ms wait.

Before the first shared call both intervals start where both ranks are traced (the later of
their trace starts): what a rank did before its own trace began is not known. So the part of a
wait that lies before the cause's trace began (profilers started apart: the waiter reached a
barrier while the cause was not yet traced) is ``before trace``: charged to d, its reason outside
the trace, and never the top cause (tracekit.analyses.why). Every wait's cost is charged once:
the costs over the causes sum to the total wait.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit import labels
from tracekit.analyses import intervals as iv

Sets = dict[str, tuple[iv.Ints, iv.Ints]]
#: a cause: (rank, what, kind, phase label or None)
Key = tuple[int, str, str, "str | None"]
STATES = ("compute", "transfer", "waiting", "other", "idle")
#: the cause state of a wait begun before the cause's trace did (its reason is not traced)
BEFORE_TRACE = "before trace"

#: the frame ``root_causes``: cost per root-cause rank and what it did
CAUSES_SCHEMA = {
    "rank": pl.Int32,
    "what": pl.Utf8,
    "kind": pl.Utf8,
    "label": pl.Utf8,
    "cost_ns": pl.Int64,
}


@dataclass(frozen=True)
class Ops:
    """One rank's top-level work events (an op nested in another is counted in it)."""

    names: list[str]
    codes: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    labels: list[str | None] | None = None
    """Per code, the tracekit phase the op ran in (None: outside any); None: not known."""

    def by_name(self, a: int, b: int) -> dict[tuple[str, str | None], int]:
        """Time per (op name, phase label) inside [a, b] (ops starting there, clipped to it)."""
        i, j = np.searchsorted(self.starts, [a, b], side="left")
        if j <= i:
            return {}
        d = np.clip(np.minimum(self.ends[i:j], b) - self.starts[i:j], 0, None)
        sums = np.bincount(self.codes[i:j], weights=d, minlength=len(self.names))
        labels = self.labels or [None] * len(self.names)
        return {(self.names[k], labels[k]): int(sums[k]) for k in np.flatnonzero(sums)}


#: the map's ``top_ops`` (tracekit.analyses.rank_map): each rank's top-level compute events
TOP_OPS_SCHEMA = {
    "rank": pl.Int32,
    "name": pl.Utf8,
    "label": pl.Utf8,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}


def _phase(name: str) -> str | None:
    """The phase a tracekit label names: forward, backward, optimizer, zero_grad, or a pipeline
    op (F / B / W of a stage); None for the step, communication, and names not ours."""
    lab = labels.parse(name)
    if lab is None:
        return None
    if lab.family == "phase" and lab.phase != labels.STEP:
        return lab.phase
    if lab.family == "pipeline":
        return f"{lab.kind}:s{lab.stage}"
    return None


def _with_phase(ops: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``label``: the innermost tracekit phase annotation of the op's thread open at its start."""
    ann = events.filter(pl.col("kind") == "annotation").select(
        "rank", "tid", "name", "start_ns", "end_ns"
    )
    phases = {n: _phase(n) for n in ann["name"].unique().to_list()}  # few distinct names
    ann = ann.with_columns(
        pl.col("name").replace_strict(phases, default=None, return_dtype=pl.Utf8).alias("label")
    ).filter(pl.col("label").is_not_null())
    if ann.height == 0:
        return ops.with_columns(pl.lit(None, dtype=pl.Utf8).alias("label"))
    ann = ann.select(
        "rank", "tid", pl.col("start_ns").alias("a_start"), pl.col("end_ns").alias("a_end"), "label"
    ).sort("a_start")
    # the latest-starting phase before the op: nested phases start later, so it is the innermost
    # open one unless it already ended (then the op is outside every phase of that kind)
    joined = ops.sort("start_ns").join_asof(
        ann,
        left_on="start_ns",
        right_on="a_start",
        by=["rank", "tid"],
        strategy="backward",
        check_sortedness=False,  # both sorted by time above; polars cannot check with by=
    )
    return joined.with_columns(
        pl.when(pl.col("a_end") >= pl.col("start_ns")).then(pl.col("label")).alias("label")
    ).drop("a_start", "a_end")


def top_level_ops(events: pl.DataFrame, gpu_ranks: frozenset[int] | set[int]) -> pl.DataFrame:
    """The compute events of each rank that no earlier one of its thread/stream contains
    (:data:`TOP_OPS_SCHEMA`). A GPU rank (listed, or with any device event): device kernels
    only, as the timeline's compute state."""
    compute = (pl.col("kind") == "compute").fill_null(False)
    on_device = compute & (pl.col("device") != "cpu")  # a rank with device kernels: those only
    with_device = events.select("rank", on_device.alias("d")).filter("d")["rank"].unique()
    on_gpu = pl.col("rank").is_in(sorted({*gpu_ranks, *with_device.to_list()}))
    keys = ("rank", "device", "tid")
    # only the columns used: a filter of the whole table copied every compute row's thread name
    mask = events.select(compute & (~on_gpu | (pl.col("device") != "cpu"))).to_series()
    e = events.select(*keys, "name", "start_ns", "end_ns").filter(mask)
    top = (
        e.select(*keys, "name", "start_ns", "end_ns")
        .sort(*keys, "start_ns", pl.col("end_ns"), descending=[False] * 4 + [True])
        .with_columns(pl.col("end_ns").cum_max().shift(1).over(keys).alias("_reach"))
        .filter(pl.col("_reach").is_null() | (pl.col("start_ns") >= pl.col("_reach")))
        .select("rank", "tid", pl.col("name").fill_null("?"), "start_ns", "end_ns")
    )
    return (
        _with_phase(top, events)
        .select(list(TOP_OPS_SCHEMA))
        .sort("rank", "start_ns")
        .cast(TOP_OPS_SCHEMA)  # type: ignore[arg-type]
    )


def ops_of(top_ops: pl.DataFrame) -> dict[int, Ops]:
    """Each rank's :class:`Ops` from the map's ``top_ops`` frame."""
    out = {}
    for (rank,), e in top_ops.partition_by("rank", as_dict=True, maintain_order=True).items():
        e = e.sort("start_ns")
        # one code per (name, phase): the same op in forward and in backward are two causes
        keyed = e["name"].cast(pl.Utf8) + "\x1f" + e["label"].fill_null("")
        # np.unique's sorted codes, by polars: numpy's fixed-width text array held every name
        # at the longest one's width (4 bytes a character: 1.6 GB for a 405 MB rank, #29)
        cats = keyed.unique().sort()
        codes = (keyed.rank("dense") - 1).cast(pl.Int64).to_numpy()
        pairs = [c.split("\x1f", 1) for c in cats.to_list()]
        out[int(rank)] = Ops(
            [n for n, _ in pairs],
            codes,
            e["start_ns"].to_numpy().astype(np.int64),
            e["end_ns"].to_numpy().astype(np.int64),
            [lab or None for _, lab in pairs],
        )
    return out


def instances(waits: pl.DataFrame, starts: dict[int, int]) -> pl.DataFrame:
    """Each wait of a rank on the last arriver, with both ranks' interval since the previous
    call they shared (before the first: from the later of their trace starts): waiter, cause,
    call_id, wait_ns, w_from, w_to, d_from, d_to, at, w_start, d_start (the cause's trace start)."""
    m = waits.select(
        "call_id",
        "rank",
        "start_ns",
        pl.col("done_ns").alias("end_ns"),
        "last_rank",
        "last_arrival_ns",
        "wait_ns",
    )
    pairs = (
        m.join(
            m.select("call_id", pl.col("rank").alias("d"), pl.col("end_ns").alias("d_end")),
            on="call_id",
        )
        .filter(pl.col("rank") != pl.col("d"))
        .sort("rank", "d", "start_ns")
        .with_columns(
            pl.col("end_ns").shift(1).over("rank", "d").alias("w_from"),
            pl.col("d_end").shift(1).over("rank", "d").alias("d_from"),
        )
        .filter((pl.col("d") == pl.col("last_rank")) & (pl.col("wait_ns") > 0))
    )
    first = pl.DataFrame(
        {"r": list(starts), "s": list(starts.values())}, schema={"r": pl.Int32, "s": pl.Int64}
    )
    both = pl.max_horizontal(pl.col("_ws"), pl.col("_ds"))  # where both ranks are traced
    return (
        pairs.join(first.rename({"r": "rank", "s": "_ws"}), on="rank", how="left")
        .join(first.rename({"r": "d", "s": "_ds"}), on="d", how="left")
        .select(
            pl.col("rank").alias("waiter"),
            pl.col("d").alias("cause"),
            "call_id",
            "wait_ns",
            pl.min_horizontal(pl.col("w_from").fill_null(both), "start_ns").alias("w_from"),
            pl.col("start_ns").alias("w_to"),
            pl.min_horizontal(pl.col("d_from").fill_null(both), "last_arrival_ns").alias("d_from"),
            pl.col("last_arrival_ns").alias("d_to"),
            pl.col("last_arrival_ns").alias("at"),
            pl.col("start_ns").alias("w_start"),
            pl.col("_ds").alias("d_start"),
        )
        .sort("at", "waiter")
    )


def _state_times(sets: Sets, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    comm = iv.inside(*sets["comm"], a, b)
    waiting = iv.inside(*sets["waiting"], a, b)
    return {
        "compute": iv.inside(*sets["compute"], a, b),
        "transfer": comm - waiting,
        "waiting": waiting,
        "other": iv.inside(*sets["other"], a, b),
        "idle": iv.inside(*sets["idle"], a, b),
    }


def _per_rank(
    inst: pl.DataFrame, col: str, lo: str, hi: str, sets: dict[int, Sets]
) -> dict[str, np.ndarray]:
    """State times of each instance's rank ``col`` inside [lo, hi], vectorised per rank."""
    out = {s: np.zeros(inst.height, np.int64) for s in STATES}
    ranks = inst[col].to_numpy()
    a, b = inst[lo].to_numpy().astype(np.int64), inst[hi].to_numpy().astype(np.int64)
    for r in np.unique(ranks):
        if int(r) not in sets:
            continue
        sel = ranks == r
        for s, v in _state_times(sets[int(r)], a[sel], b[sel]).items():
            out[s][sel] = v
    return out


def root_causes(
    waits: pl.DataFrame, sets: dict[int, Sets], ops: dict[int, Ops], starts: dict[int, int]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(``root_causes``: rank, what, kind ("op" or "state"), label (the op's phase), cost_ns;
    the instances with
    their direct and propagated cost: waiter, cause, call_id, wait_ns, direct_ns,
    propagated_ns)."""
    inst = instances(waits, starts)
    if inst.height == 0:
        return pl.DataFrame(schema=CAUSES_SCHEMA), inst
    d_t = _per_rank(inst, "cause", "d_from", "d_to", sets)
    w_t = _per_rank(inst, "waiter", "w_from", "w_to", sets)
    excess = {s: np.clip(d_t[s] - w_t[s], 0, None) for s in STATES}
    rows = inst.to_dicts()
    # each rank's wait instances, by start, to find those inside a cause's interval
    vectors: list[dict[Key, float]] = []
    by_waiter: dict[int, list[int]] = defaultdict(list)
    direct_col, prop_col = [], []
    for i, row in enumerate(rows):
        w_ns, d = row["wait_ns"], row["cause"]
        ex = {s: float(excess[s][i]) for s in STATES}
        total = sum(ex.values())
        vec: dict[Key, float] = defaultdict(float)
        untraced = _before_trace(row)
        if untraced > 0:
            vec[(d, BEFORE_TRACE, "state", None)] += untraced
        traced = w_ns - untraced  # the part of the wait the excess can explain
        # what the excess explains; the rest of the wait is d having begun later
        explained = min(traced, total)
        if traced > explained:
            vec[(d, "late start", "state", None)] += traced - explained
        prop = explained * ex["waiting"] / total if total > 0 else 0.0
        direct = w_ns - prop
        if total > 0:
            for s in ("transfer", "other", "idle"):
                if ex[s] > 0:
                    vec[(d, s, "state", None)] += explained * ex[s] / total
            if ex["compute"] > 0:
                part = explained * ex["compute"] / total
                _charge_ops(vec, d, part, row, ops)
        if prop > 0:
            _propagate(vec, prop, d, row, rows, vectors, by_waiter)
        vectors.append(vec)
        by_waiter[row["waiter"]].append(i)
        direct_col.append(int(direct))
        prop_col.append(int(prop))
    totals: dict[Key, float] = defaultdict(float)
    for vec in vectors:
        for k, v in vec.items():
            totals[k] += v
    causes = pl.DataFrame(
        [
            (r, what, kind, lab, int(round(v)))
            for (r, what, kind, lab), v in totals.items()
            if v >= 0.5
        ],
        schema=CAUSES_SCHEMA,
        orient="row",
    ).sort(
        "cost_ns", "rank", "what", "label", descending=[True, False, False, False], nulls_last=True
    )
    inst = inst.select("waiter", "cause", "call_id", "wait_ns").with_columns(
        pl.Series("direct_ns", direct_col, pl.Int64), pl.Series("propagated_ns", prop_col, pl.Int64)
    )
    return causes, inst


def _before_trace(row: dict) -> float:
    """The part of a wait before the cause's trace began: [w_start, w_start + wait] cut at it."""
    d_start = row["d_start"]
    if d_start is None:
        return 0.0
    return float(min(row["wait_ns"], max(0, d_start - row["w_start"])))


def _charge_ops(vec: dict, d: int, part: float, row: dict, ops: dict[int, Ops]) -> None:
    """The compute share of a wait, on the cause's ops in excess of the waiter's, by name."""
    mine = ops[d].by_name(row["d_from"], row["d_to"]) if d in ops else {}
    w = row["waiter"]
    theirs = ops[w].by_name(row["w_from"], row["w_to"]) if w in ops else {}
    ex = {n: t - theirs.get(n, 0) for n, t in mine.items() if t > theirs.get(n, 0)}
    total = sum(ex.values())
    if total <= 0:
        vec[(d, "compute", "state", None)] += part
        return
    for (n, label), v in ex.items():
        vec[(d, n, "op", label)] += part * v / total


def _propagate(
    vec: dict,
    prop: float,
    d: int,
    row: dict,
    rows: list[dict],
    vectors: list[dict],
    by_waiter: dict[int, list[int]],
) -> None:
    """The waiting share of a wait, on the causes of the cause's own waits in its interval."""
    a, b = row["d_from"], row["d_to"]
    mine = [
        (j, min(rows[j]["w_start"] + rows[j]["wait_ns"], b) - max(rows[j]["w_start"], a))
        for j in by_waiter.get(d, [])
    ]
    mine = [(j, o) for j, o in mine if o > 0]
    total = sum(o for _, o in mine)
    if total <= 0:
        vec[(d, "waiting", "state", None)] += prop
        return
    for j, o in mine:
        src = vectors[j]
        s = sum(src.values())
        for k, v in src.items():
            vec[k] += prop * (o / total) * (v / s)
