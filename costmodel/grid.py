"""Piecewise-linear lookups with linear extrapolation beyond the ends.

Shared by the tables the simulator loads and the additive step regressor, so that what was
fitted and what is looked up are the same function. Only numpy: a lookup finds each value's
segment, then does a few multiply-adds. The `*_at` forms look up one value in plain floats over
Python lists (the simulator's one-step path, where numpy's per-call cost dominates), with the
same operations in the same order, so they give the same bits.

Finding the segment: a binary search over the knots (searchsorted, bisect), or, for tables the
simulator looks up again and again, a SegmentIndex: the segment of every integer from 0 to the
last knot, computed once. The values looked up are mostly counts (tokens, sequences), so one
array read replaces a search whose cost grows with the knots (the data's axes hold ~9x the old
log grid's); anything the index cannot answer exactly (beyond it, NaN, a unit interval with a
knot strictly inside) is searched as before. The segment is the same either way, so are the bits.
"""
from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache

import numpy as np

# The most integers one index covers (num_tokens axes reach 65,536; a prefill context 131,072):
# 8 bytes each in the array and in the list.
INDEX_MAX_INTEGERS = 1 << 17


class SegmentIndex:
    """segments()'s segment of every integer u in 0..limit-1: the segment of every x in [u, u+1)
    unless a knot lies strictly inside that interval (then -1: search). `table` for the vectorised
    lookup, `rows` (the same, as a Python list) for the one-value lookup."""

    __slots__ = ("knots", "limit", "partial", "rows", "table")

    def __init__(self, knots: np.ndarray):
        self.knots = knots
        n = len(knots)
        self.limit = int(min(max(np.floor(knots[-1]), 0.0), INDEX_MAX_INTEGERS - 1)) + 1
        whole = np.arange(self.limit, dtype=np.float64)
        table = np.clip(np.searchsorted(knots, whole, side="right") - 1, 0, n - 2).astype(np.intp)
        inside = knots[(knots != np.floor(knots)) & (knots > 0) & (knots < self.limit)]
        table[np.floor(inside).astype(np.intp)] = -1
        self.table = table
        self.partial = bool(len(inside))
        # One int object per segment, shared by every entry: the list costs 8 bytes an entry.
        segment = list(range(-1, n - 1))
        self.rows = [segment[i + 1] for i in table.tolist()]

    def find(self, x: np.ndarray) -> np.ndarray:
        """The segment of each x, as np.clip(np.searchsorted(knots, x, "right") - 1, 0, n - 2) gives it."""
        flat = x.reshape(-1)
        if not flat.size:
            return np.zeros(x.shape, dtype=np.intp)
        if flat.min() >= 0.0 and flat.max() < self.limit:      # a NaN fails both
            i = self.table[flat.astype(np.intp)]               # truncation is floor for x >= 0
            if not self.partial:
                return i.reshape(x.shape)
            search = i < 0
        else:
            inside = (flat >= 0.0) & (flat < self.limit)
            i = np.full(len(flat), -1, dtype=np.intp)
            i[inside] = self.table[flat[inside].astype(np.intp)]
            search = i < 0
        if search.any():
            i[search] = _search(flat[search], self.knots)
        return i.reshape(x.shape)


def _search(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(knots, x, side="right") - 1, 0, len(knots) - 2)


def segment_index(knots: np.ndarray) -> SegmentIndex | None:
    """The index of an axis (shared by every table on the same knots); None for one knot."""
    knots = np.ascontiguousarray(knots, dtype=np.float64)
    if len(knots) < 2:
        return None
    return _cached_index(knots.tobytes())


@lru_cache(maxsize=256)
def _cached_index(knots_bytes: bytes) -> SegmentIndex:
    return SegmentIndex(np.frombuffer(knots_bytes, dtype=np.float64))


def segments(x: np.ndarray, knots: np.ndarray, index: SegmentIndex | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Segment index i (knots[i]..knots[i+1]) and fraction t of x along it; t < 0 or > 1 outside.
    `index`: segment_index(knots), to find i without a binary search (the same i)."""
    if len(knots) == 1:
        return np.zeros(len(x), dtype=np.intp), np.zeros(len(x))
    i = index.find(x) if index is not None else _search(x, knots)
    t = (x - knots[i]) / (knots[i + 1] - knots[i])
    return i, t


def interp1(x, knots: np.ndarray, values: np.ndarray, index: SegmentIndex | None = None) -> np.ndarray:
    """values at x, linear between knots and along the end segments beyond them."""
    x = np.asarray(x, dtype=np.float64)
    if len(knots) == 1:
        return np.full(x.shape, float(values[0]))
    i, t = segments(x, knots, index)
    return values[i] + t * (values[i + 1] - values[i])


def interp2(x, y, xknots: np.ndarray, yknots: np.ndarray, values: np.ndarray,
            indexes: tuple[SegmentIndex | None, SegmentIndex | None] = (None, None)) -> np.ndarray:
    """Bilinear on a (len(xknots), len(yknots)) grid, extrapolating linearly on both axes."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    i, u = segments(x, xknots, indexes[0])
    j, v = segments(y, yknots, indexes[1])
    i1 = np.minimum(i + 1, len(xknots) - 1)
    j1 = np.minimum(j + 1, len(yknots) - 1)
    low = values[i, j] + v * (values[i, j1] - values[i, j])
    high = values[i1, j] + v * (values[i1, j1] - values[i1, j])
    return low + u * (high - low)


def segment_at(x: float, knots: list, rows: list | None = None) -> tuple[int, float]:
    """segments() for one value; `rows`: a SegmentIndex's rows, to skip the search."""
    if len(knots) == 1:
        return 0, 0.0
    if rows is not None and 0.0 <= x < len(rows) and (i := rows[int(x)]) >= 0:
        return i, (x - knots[i]) / (knots[i + 1] - knots[i])
    i = min(max(bisect_right(knots, x) - 1, 0), len(knots) - 2)
    return i, (x - knots[i]) / (knots[i + 1] - knots[i])


def interp1_at(x: float, knots: list, values: list, rows: list | None = None) -> float:
    """interp1() for one value."""
    if len(knots) == 1:
        return values[0]
    i, t = segment_at(x, knots, rows)
    return values[i] + t * (values[i + 1] - values[i])


def interp2_at(x: float, y: float, xknots: list, yknots: list, values: list,
               rows: tuple[list | None, list | None] = (None, None)) -> float:
    """interp2() for one point; values is a list of rows."""
    i, u = segment_at(x, xknots, rows[0])
    j, v = segment_at(y, yknots, rows[1])
    i1, j1 = min(i + 1, len(xknots) - 1), min(j + 1, len(yknots) - 1)
    low = values[i][j] + v * (values[i][j1] - values[i][j])
    high = values[i1][j] + v * (values[i1][j1] - values[i1][j])
    return low + u * (high - low)


def basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """The design matrix of interp1: interp1(x, knots, v) == basis(x, knots) @ v."""
    out = np.zeros((len(x), len(knots)))
    if len(knots) == 1:
        out[:, 0] = 1.0
        return out
    i, t = segments(np.asarray(x, dtype=np.float64), knots)
    rows = np.arange(len(x))
    out[rows, i] = 1.0 - t
    out[rows, i + 1] += t
    return out


def axis(lo: float, hi: float, num: int, *, integer: bool = True) -> np.ndarray:
    """A geometric axis from lo to hi (dense where step times bend), deduplicated."""
    lo = max(float(lo), 1.0)
    hi = max(float(hi), lo)
    points = np.geomspace(lo, hi, num)
    if integer:
        points = np.round(points)
    return np.unique(points)
