"""Piecewise-linear lookups with linear extrapolation beyond the ends.

Shared by the tables the simulator loads and the additive step regressor, so that what was
fitted and what is looked up are the same function. Only numpy: a lookup is searchsorted plus
a few multiply-adds. The `*_at` forms look up one value in plain floats over Python lists (the
simulator's one-step path, where numpy's per-call cost dominates), with the same operations in
the same order, so they give the same bits.
"""
from __future__ import annotations

from bisect import bisect_right

import numpy as np


def segments(x: np.ndarray, knots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment index i (knots[i]..knots[i+1]) and fraction t of x along it; t < 0 or > 1 outside."""
    if len(knots) == 1:
        return np.zeros(len(x), dtype=np.intp), np.zeros(len(x))
    i = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, len(knots) - 2)
    t = (x - knots[i]) / (knots[i + 1] - knots[i])
    return i, t


def interp1(x, knots: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values at x, linear between knots and along the end segments beyond them."""
    x = np.asarray(x, dtype=np.float64)
    if len(knots) == 1:
        return np.full(x.shape, float(values[0]))
    i, t = segments(x, knots)
    return values[i] + t * (values[i + 1] - values[i])


def interp2(x, y, xknots: np.ndarray, yknots: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Bilinear on a (len(xknots), len(yknots)) grid, extrapolating linearly on both axes."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    i, u = segments(x, xknots)
    j, v = segments(y, yknots)
    i1 = np.minimum(i + 1, len(xknots) - 1)
    j1 = np.minimum(j + 1, len(yknots) - 1)
    low = values[i, j] + v * (values[i, j1] - values[i, j])
    high = values[i1, j] + v * (values[i1, j1] - values[i1, j])
    return low + u * (high - low)


def segment_at(x: float, knots: list) -> tuple[int, float]:
    """segments() for one value."""
    if len(knots) == 1:
        return 0, 0.0
    i = min(max(bisect_right(knots, x) - 1, 0), len(knots) - 2)
    return i, (x - knots[i]) / (knots[i + 1] - knots[i])


def interp1_at(x: float, knots: list, values: list) -> float:
    """interp1() for one value."""
    if len(knots) == 1:
        return values[0]
    i, t = segment_at(x, knots)
    return values[i] + t * (values[i + 1] - values[i])


def interp2_at(x: float, y: float, xknots: list, yknots: list, values: list) -> float:
    """interp2() for one point; values is a list of rows."""
    i, u = segment_at(x, xknots)
    j, v = segment_at(y, yknots)
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
