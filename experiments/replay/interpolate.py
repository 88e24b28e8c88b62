"""Interpolation of kernel times between measured shapes, refusing what lies outside them.

Kernel times grow as powers of their shape's sizes over most of their range (a GEMM's time ~ m n k
past the launch floor; a decode's ~ its KV tokens), so the interpolation is linear in
log(1 + size) and log(time): over one varying axis between its two measured neighbours, over
several linear on the Delaunay simplex of measured shapes that holds the query (scipy's
LinearNDInterpolator). A query outside the convex hull of the measured shapes gets no answer,
never an extrapolation: a campaign scored on replayed data is then scored on data that exists.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.interpolate import LinearNDInterpolator

MEASURED = "measured"
INTERPOLATED = "interpolated"


@dataclass(frozen=True)
class Estimate:
    """A replayed time: the log-space interpolation of the measured times and scatters."""
    time_ms: float
    rel_scatter: float     # sigma of log(time) over repeats
    kind: str              # MEASURED (the shape was measured) or INTERPOLATED


class LogInterpolator:
    """Times over the shapes of one op slice: `coords` (n points x d axes, sizes >= 0), `times_ms`
    and `rel_scatter` per point. Shapes measured more than once are pooled (geometric mean)."""

    def __init__(self, coords: np.ndarray, times_ms: np.ndarray, rel_scatter: np.ndarray) -> None:
        coords = np.log1p(np.asarray(coords, dtype=np.float64))
        log_t = np.log(np.asarray(times_ms, dtype=np.float64))
        unique, inverse = np.unique(coords, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        counts = np.bincount(inverse)
        self.coords = unique
        self.log_time = np.bincount(inverse, log_t) / counts
        self.scatter = np.bincount(inverse, np.asarray(rel_scatter, dtype=np.float64)) / counts
        self.varying = np.flatnonzero(np.ptp(unique, axis=0) > 0) if len(unique) else np.array([], int)
        self._exact = {tuple(row): i for i, row in enumerate(unique)}
        self._nd = None
        if len(self.varying) >= 2:
            values = np.column_stack([self.log_time, self.scatter])
            self._nd = LinearNDInterpolator(unique[:, self.varying], values)

    def estimate(self, coords) -> Estimate | None:
        """The time at one shape; None outside the measured hull."""
        x = np.log1p(np.asarray(coords, dtype=np.float64))
        exact = self._exact.get(tuple(x))
        if exact is not None:
            return Estimate(float(np.exp(self.log_time[exact])), float(self.scatter[exact]), MEASURED)
        fixed = np.setdiff1d(np.arange(len(x)), self.varying)
        if not np.allclose(x[fixed], self.coords[0, fixed]):
            return None    # an axis the profile never varied, at another value
        if len(self.varying) == 0:
            return None
        if len(self.varying) == 1:
            return self._estimate_1d(x[self.varying[0]])
        log_time, scatter = self._nd(x[self.varying][None, :])[0]
        if not np.isfinite(log_time):
            return None
        return Estimate(float(np.exp(log_time)), float(scatter), INTERPOLATED)

    def _estimate_1d(self, x: float) -> Estimate | None:
        axis = self.coords[:, self.varying[0]]
        if x < axis.min() or x > axis.max():
            return None
        order = np.argsort(axis)
        log_time = np.interp(x, axis[order], self.log_time[order])
        scatter = np.interp(x, axis[order], self.scatter[order])
        return Estimate(float(np.exp(log_time)), float(scatter), INTERPOLATED)
