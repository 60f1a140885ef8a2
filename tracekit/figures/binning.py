"""The binned timeline: per lane and time bin, how long each state lasted, as one heatmap.

The timeline is cut into at most :data:`MAX_BINS` time bins per lane (:data:`MAX_CELLS` cells
in all) by :func:`bin_states`, loop-free (segments crossing bins are split exactly); each cell
takes the colour of the state that fills most of the bin, paler when it fills less, and its
hover lists every state's share. One heatmap trace, typed arrays: 64 ranks x 1,562 bins is
about 1.5 MB and draws in well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import polars as pl

from tracekit.figures.style import NS, STATE_CODE, STATE_COLORS, STATE_LABELS, STATES, mix

MAX_BINS = 2000  # cells per lane in the binned views
MAX_CELLS = 100_000  # cells per binned view (64 lanes: 1,562 bins; ~1.3 MB of typed arrays)


def bin_states(
    tl: pl.DataFrame, lanes: Sequence[int], lo_ns: int, hi_ns: int, bins: int
) -> np.ndarray:
    """Nanoseconds of each state per lane and bin of [lo_ns, hi_ns): array (lanes, bins, 5).

    Exact and loop-free, however many bins a span crosses: a span adds its part of the bin it
    starts in, removes the part of the bin it ends in that lies after its end, and counts as
    open (one full bin width) in every bin after its start bin and up to its end bin. Per
    (lane, state) that is two ``np.bincount`` over the starts and ends and one ``cumsum`` over
    the bins, whatever the number of spans.
    """
    n_lanes, n_states = len(lanes), len(STATES)
    if hi_ns <= lo_ns or tl.height == 0 or n_lanes == 0:
        return np.zeros((n_lanes, bins, n_states), dtype=np.float64)
    width = (hi_ns - lo_ns) / bins
    # positions in bins since lo_ns; int64 ns are made relative before the cast (float64
    # holds absolute epoch ns only to ~256 ns)
    f = tl.filter((pl.col("end_ns") > lo_ns) & (pl.col("start_ns") < hi_ns)).select(
        pl.col("rank").cast(pl.Int64),
        pl.col("state")
        .replace_strict(STATE_CODE, default=STATE_CODE["idle"], return_dtype=pl.Int64)
        .alias("code"),
        ((pl.col("start_ns").clip(lower_bound=lo_ns) - lo_ns).cast(pl.Float64) / width).alias("s"),
        ((pl.col("end_ns").clip(upper_bound=hi_ns) - lo_ns).cast(pl.Float64) / width).alias("e"),
    )
    rank = f["rank"].to_numpy()
    # rank -> lane by a search in the sorted lanes: a table indexed by rank would be as long
    # as the largest rank number (2^31 for a trace that says so)
    lane_of = np.asarray(lanes, dtype=np.int64)
    by = np.argsort(lane_of, kind="stable")
    at = np.clip(np.searchsorted(lane_of[by], rank), 0, n_lanes - 1)
    lane = np.where(lane_of[by][at] == rank, by[at], -1)
    s_, e_ = f["s"].to_numpy(), f["e"].to_numpy()
    keep = (lane >= 0) & (e_ > s_)
    row = (lane * n_states + f["code"].to_numpy())[keep]  # (lane, state) row of the result
    s_, e_ = s_[keep], e_[keep]
    # one extra bin for spans ending at hi_ns exactly; dropped at the end
    width1 = bins + 1
    b0 = np.minimum(s_.astype(np.int64), bins)
    b1 = np.minimum(e_.astype(np.int64), bins)
    at_start, at_end = row * width1 + b0, row * width1 + b1
    size = n_lanes * n_states * width1
    part = np.bincount(at_start, weights=(b0 + 1) - s_, minlength=size) - np.bincount(
        at_end, weights=(b1 + 1) - e_, minlength=size
    )
    opened = np.bincount(at_start, minlength=size) - np.bincount(at_end, minlength=size)
    part, opened = part.reshape(-1, width1), opened.reshape(-1, width1)
    open_before = np.cumsum(opened, axis=1) - opened  # spans open at each bin's left edge
    out = np.maximum((part + open_before)[:, :bins] * width, 0.0)
    return out.reshape(n_lanes, n_states, bins).transpose(0, 2, 1)


def _state_colorscale() -> list[list]:
    """z = code + share: each state a band from pale (fills little of its bin) to full colour."""
    scale: list[list] = []
    n = len(STATES)
    for code, state in enumerate(STATES):
        full = STATE_COLORS[state]
        scale.append([code / n, mix(full, "#ffffff", 0.6)])
        scale.append([(code + 0.999) / n, full])
    scale[-1][0] = 1.0
    return scale


def heatmap_trace(
    tl: pl.DataFrame, lanes: Sequence[int], t0_ns: int, lo_ns: int, hi_ns: int, bins: int
) -> tuple[go.Heatmap, float, int]:
    """The binned view of [lo_ns, hi_ns) (x: seconds since t0_ns), its bin width (ns) and bins."""
    bins = int(max(1, min(bins, MAX_BINS, MAX_CELLS // max(1, len(lanes)), hi_ns - lo_ns)))
    width = (hi_ns - lo_ns) / bins
    ns = bin_states(tl, lanes, lo_ns, hi_ns, bins)
    shares = ns / width
    total = shares.sum(axis=2)
    dominant = shares.argmax(axis=2)
    dom_share = np.clip(shares.max(axis=2), 0.0, 1.0)
    z = np.where(total > 0.01, dominant + 0.999 * dom_share, np.nan).astype(np.float32)
    big = max(lanes, default=0) > 255
    custom = np.empty((len(lanes), bins, len(STATES) + 1), dtype=np.uint16 if big else np.uint8)
    custom[:, :, : len(STATES)] = np.rint(np.clip(shares, 0, 1) * 100)
    custom[:, :, len(STATES)] = np.asarray(lanes, dtype=np.int64)[:, None]
    x = ((lo_ns - t0_ns) + (np.arange(bins) + 0.5) * width) * NS
    hover = (
        "rank %{customdata[5]} · t = %{x:.6f} s<br>"
        + "<br>".join(f"{STATE_LABELS[s]}: %{{customdata[{i}]}}%" for i, s in enumerate(STATES))
        + "<extra></extra>"
    )
    trace = go.Heatmap(
        x=x,
        y=np.arange(len(lanes)),
        z=z,
        customdata=custom,
        zmin=0,
        zmax=len(STATES),
        colorscale=_state_colorscale(),
        showscale=False,
        hoverongaps=False,
        hovertemplate=hover,
        name="timeline (binned)",
    )
    return trace, width, bins


def merge_per_pixel(spans: pl.DataFrame, px_ns: float, keys: Sequence[str]) -> pl.DataFrame:
    """Spans of one key closer than a pixel merged into one (start_ns, end_ns, count)."""
    if spans.height == 0:
        return spans.with_columns(pl.lit(0, pl.UInt32).alias("count"))
    return (
        spans.sort(*keys, "start_ns")
        .with_columns(pl.col("end_ns").cum_max().over(keys).shift(1).over(keys).alias("_prev"))
        .with_columns(
            (pl.col("_prev").is_null() | (pl.col("start_ns") > pl.col("_prev") + px_ns))
            .cum_sum()
            .over(keys)
            .alias("_g")
        )
        .group_by(*keys, "_g")
        .agg(
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.len().alias("count"),
            *[pl.col(c).first() for c in spans.columns if c not in (*keys, "start_ns", "end_ns")],
        )
        .drop("_g")
    )
