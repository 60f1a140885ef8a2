"""Interval arithmetic on sorted, disjoint intervals, vectorised with numpy (the why-analysis:
tracekit.analyses.wait_states, .root_causes, .critical_path).

A set of intervals is two int64 arrays (starts, ends), sorted and disjoint after :func:`union`.
``covered(starts, ends, t)`` is the length of the set before each time t, so the set's length
inside [a, b] is ``covered(b) - covered(a)``: one searchsorted per query, no loop.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]


def union(starts: Ints, ends: Ints) -> tuple[Ints, Ints]:
    """The union of any intervals, as sorted disjoint intervals (empty ones dropped)."""
    keep = ends > starts
    s, e = np.asarray(starts, np.int64)[keep], np.asarray(ends, np.int64)[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # a new piece starts where an interval begins after everything before it has ended
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.append(reach[idx[1:] - 1], reach[-1])


def intersect(a: tuple[Ints, Ints], b: tuple[Ints, Ints]) -> tuple[Ints, Ints]:
    """The intersection of two sets of disjoint intervals (a sweep over their ends)."""
    t = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones_like(a[0]), -np.ones_like(a[1]), 0 * b[0], 0 * b[1]])
    db = np.concatenate([0 * a[0], 0 * a[1], np.ones_like(b[0]), -np.ones_like(b[1])])
    if t.size == 0:
        return t, t
    # ends before starts at one instant: touching intervals do not intersect
    order = np.lexsort((da + db, t))
    t, inside = t[order], (np.cumsum(da[order]) > 0) & (np.cumsum(db[order]) > 0)
    s, e = t[:-1][inside[:-1]], t[1:][inside[:-1]]
    return union(s, e)


def minus(a: tuple[Ints, Ints], b: tuple[Ints, Ints]) -> tuple[Ints, Ints]:
    """The part of disjoint set a outside disjoint set b."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    lo, hi = min(a[0][0], b[0][0]), max(a[1][-1], b[1][-1])
    gaps = (np.concatenate([[lo], b[1]]), np.concatenate([b[0], [hi]]))  # b's complement
    return intersect(a, union(*gaps))


def covered(starts: Ints, ends: Ints, t: Ints) -> Ints:
    """For each time in t, the length of the disjoint sorted set before it (ns)."""
    t = np.asarray(t, np.int64)
    if starts.size == 0:
        return np.zeros(t.shape, np.int64)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.clip(i, 0, None)
    part = np.clip(t - starts[j], 0, ends[j] - starts[j])
    return np.where(i < 0, 0, cum[j] + part)


def inside(starts: Ints, ends: Ints, a: Ints, b: Ints) -> Ints:
    """Length of the disjoint sorted set inside each [a, b] (0 where b <= a)."""
    return np.clip(covered(starts, ends, b) - covered(starts, ends, a), 0, None)
