"""An additive piecewise-linear regressor: time = c + Σ_j g_j(x_j), each g_j a 1-D grid.

This is the form a whole-step T_step table takes (one small grid per batch feature, looked
up with interpolation and linear extrapolation), fitted directly to measured steps so that
the table the simulator loads is exactly the model whose held-out error is reported.
"""
from __future__ import annotations

import numpy as np
from sklearn.utils.validation import check_is_fitted, validate_data

from stepcal.costmodel import grid
from stepcal.costmodel.regressors import TimeRegressor


class AdditiveGridRegressor(TimeRegressor):
    """Relative-error ridge fit of one piecewise-linear function per feature, for the mean.

    `n_knots` knots per feature at quantiles of the training values; `smoothing` penalises
    second differences of each function (bends need evidence); `reweight` rounds of refitting.

    Every latency the simulator reports is a sum of step times, so the table must give each
    batch's *mean* time. Weighting squared errors by 1/measured (plain relative least squares)
    pulls the fit below the mean when step times are noisy and right-skewed (measured on the
    quickstart's step logs: -8 to -15% in total time). So the first fit, weighted by 1/measured,
    only sets the scale; each further round weights by 1/predicted, which keeps errors
    relative (small and large steps count alike) but no longer favours the fast samples.

    `monotone` holds curves non-decreasing: True for all, or a flag per feature. Step features count
    work (sequences, tokens, KV tokens), and more of it never makes a step faster. Unconstrained, the
    curves of correlated features trade off: in a profile's grid num_seqs is num_decode or one more,
    and free curves priced real runs' steps of two prompts beside decodes at 0.64-0.79 of their
    measured time (two bursty quickstart campaigns, eight knots). One curve may have to fall:
    costmodel.features.TargetKind.falling says which, and why.
    """

    def __init__(self, n_knots=8, smoothing=1e-3, reweight=2, monotone=False):
        self.n_knots = n_knots
        self.smoothing = smoothing
        self.reweight = reweight
        self.monotone = monotone

    def fit(self, X, y):
        X, y = self._validate_times(X, y)
        self.knots_ = [self._knots(X[:, j]) for j in range(X.shape[1])]
        return self._fit_values(X, y)

    def _fit_values(self, X, y):
        """The curves' values and the intercept on the knots already set."""
        B, penalty = self._design(X)
        self._solve(B, penalty, y, 1.0 / y)
        floor = 0.05 * float(np.median(y))    # a wild early prediction must not get all the weight
        for _ in range(int(self.reweight)):
            self._solve(B, penalty, y, 1.0 / np.maximum(self._predict_raw(X), floor))
        return self

    def _solve(self, B, penalty, y, w) -> None:
        A = np.vstack([B * w[:, None], penalty])
        b = np.concatenate([y * w, np.zeros(len(penalty))])
        if any(self._increasing()):
            coef = self._solve_monotone(A, b)
        else:
            coef, *_ = np.linalg.lstsq(A, b, rcond=None)
        self.intercept_ = float(coef[0])
        self.values_ = []
        start = 1
        for knots in self.knots_:
            self.values_.append(coef[start:start + len(knots)])
            start += len(knots)

    def _increasing(self) -> list[bool]:
        """Per feature: is its curve held non-decreasing (`monotone`: one flag for all, or one each)."""
        flags = getattr(self, "monotone", False)   # models saved before the flag fitted without it
        if flags is None or isinstance(flags, (bool, np.bool_)):
            return [bool(flags)] * len(self.knots_)
        flags = [bool(flag) for flag in flags]
        if len(flags) != len(self.knots_):
            raise ValueError(f"monotone: {len(flags)} flags for {len(self.knots_)} features")
        return flags

    def _solve_monotone(self, A, b) -> np.ndarray:
        """Least squares over the curves' rises between knots: >= 0 for the features held increasing,
        of either sign for the others and the intercept (each the difference of two non-negative
        columns). Each curve starts at 0 at its first knot: the curves share a constant, which the
        intercept takes."""
        from scipy.optimize import nnls  # lazy: loads scipy
        sizes = [len(knots) for knots in self.knots_]
        rises = np.zeros((1 + sum(sizes), 1 + sum(size - 1 for size in sizes)))
        rises[0, 0] = 1.0
        signed = [0]          # columns of either sign: the intercept, the free features' rises
        row = column = 1
        for size, increasing in zip(sizes, self._increasing()):   # value at knot i = the sum of the rises before it
            rises[row:row + size, column:column + size - 1] = np.tril(np.ones((size, size - 1)), -1)
            if not increasing:
                signed += range(column, column + size - 1)
            row, column = row + size, column + size - 1
        # Thousands of logged steps, a hundred parameters: solve on the QR factor's square R instead
        # (the same least squares, up to a constant), 5-20x faster than on the rows themselves. R of
        # [A b] holds Q'b in its last column, so Q itself (as costly as R) is never formed: half the
        # time of a fit, whose bootstrap spread refits it 20 times.
        design = A @ rises
        augmented = np.linalg.qr(np.column_stack([design, b]), mode="r")
        r, qb = augmented[:design.shape[1], :design.shape[1]], augmented[:design.shape[1], -1]
        solution, _ = nnls(np.column_stack([r, -r[:, signed]]), qb, maxiter=50 * r.shape[1])
        x = solution[:r.shape[1]]
        x[signed] -= solution[r.shape[1]:]
        return rises @ x

    def predict(self, X):
        check_is_fitted(self, "values_")
        return self._predict_raw(validate_data(self, X, reset=False))

    def _predict_raw(self, X):
        total = np.full(len(X), self.intercept_)
        for j, (knots, values) in enumerate(zip(self.knots_, self.values_)):
            total += grid.interp1(X[:, j], knots, values)
        return np.maximum(total, 1e-6)

    def predict_spread(self, X):
        return np.zeros(len(X))

    def _knots(self, x: np.ndarray) -> np.ndarray:
        """Quantiles of the training values, joined by a geometric ladder from the smallest positive
        value to the largest. Step features are heavy-tailed (in a step log most steps hold 1-3
        sequences, a few hold a 1,000-token prefill): quantile knots alone were [1, 2, 3, 8173] for
        num_tokens, and prefills of 256-1,000 tokens came out 6-11% low on one straight segment."""
        count = max(int(self.n_knots), 2)
        knots = [np.quantile(x, np.linspace(0.0, 1.0, count))]
        low, high = max(float(x.min()), 1.0), float(x.max())
        if high > low:
            knots.append(np.geomspace(low, high, count))
        knots = np.unique(np.concatenate(knots))
        # The ladder's floats land next to the quantiles' integers (7.999999999999998 beside 8.0): a
        # segment 1e-15 wide puts 1e15 in the smoothing rows, and the solve returned all zeros.
        apart = np.diff(knots) > 1e-9 * np.maximum(np.abs(knots[1:]), 1.0)
        return knots[np.r_[True, apart]]

    def _design(self, X):
        blocks = [np.ones((len(X), 1))]
        penalties = []
        total = 1 + sum(len(k) for k in self.knots_)
        start = 1
        scale = np.sqrt(len(X))
        for j, knots in enumerate(self.knots_):
            blocks.append(grid.basis(X[:, j], knots))
            for i in range(1, len(knots) - 1):
                row = np.zeros(total)
                # Second difference in slope units, so that knot spacing does not matter.
                left = 1.0 / (knots[i] - knots[i - 1])
                right = 1.0 / (knots[i + 1] - knots[i])
                row[start + i - 1], row[start + i], row[start + i + 1] = left, -left - right, right
                row *= self.smoothing * scale * (knots[i + 1] - knots[i - 1])
                penalties.append(row)
            start += len(knots)
        # A whisper of ridge: the functions share a constant, and this picks one.
        ridge = np.eye(total)[1:] * 1e-6 * scale
        penalty = np.vstack(penalties + [ridge]) if penalties else ridge
        return np.hstack(blocks), penalty


BOOTSTRAP_FITS = 20


def bootstrap_relative_spread(estimator: AdditiveGridRegressor, X, y, num_fits: int = BOOTSTRAP_FITS,
                              seed: int = 0) -> float:
    """The uncertainty of a fitted additive model's mean, relative: over refits on bootstrap resamples of
    its rows (its knots held fixed), the standard deviation of each row's prediction over the fit's
    own, the median over the rows.

    What a `--ranges` replication draws as the model's bias (AdditiveStep.biased): a dozen profiled
    steps leave it wide, thousands of logged steps pin it down (their scatter is drawn apart,
    simulator.ranges). One number for the whole term: the features' curves trade off against each
    other between refits (num_seqs, num_decode and num_tokens move together), so their knots'
    spreads, summed, would overstate the spread of the sum many times."""
    from threadpoolctl import threadpool_limits  # lazy: loads threadpoolctl
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rng = np.random.default_rng(seed)
    fitted = estimator._predict_raw(X)
    # One BLAS thread, as in costmodel.fitting.fit_all: the refits' QR solves are small, and a second
    # thread gains nothing on them alone but thrashes when another process holds a core (a profiled
    # fit on a 2-core VM: 7.5 s with two threads, 7.9 s with one; beside one busy core, 12 s and 8 s).
    with threadpool_limits(limits=1, user_api="blas"):
        draws = [_refit_on_knots(estimator, X[rows], y[rows])._predict_raw(X)
                 for rows in (rng.integers(0, len(y), len(y)) for _ in range(num_fits))]
    return float(np.median(np.std(draws, axis=0) / fitted))


def _refit_on_knots(estimator: AdditiveGridRegressor, X, y) -> AdditiveGridRegressor:
    """The estimator's fit on other rows with its own knots (so that the values are comparable)."""
    model = AdditiveGridRegressor(estimator.n_knots, estimator.smoothing, estimator.reweight,
                                  getattr(estimator, "monotone", False))
    model.knots_ = estimator.knots_
    return model._fit_values(X, y)
