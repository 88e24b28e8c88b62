"""The whole-step table model predicts each batch's mean time, not a low-biased relative fit."""
import numpy as np

from costmodel.additive import AdditiveGridRegressor


def skewed_steps(seed: int, n: int = 4000):
    """Step times from an additive law times right-skewed noise of mean 1 (CV about 25%)."""
    rng = np.random.default_rng(seed)
    num_decode = rng.integers(1, 33, n)
    kv_sum = num_decode * rng.integers(64, 1024, n)
    X = np.column_stack([num_decode, kv_sum]).astype(float)
    mean_ms = 1.0 + 0.08 * num_decode + 0.0004 * kv_sum
    sigma = 0.25
    noise = rng.lognormal(-sigma**2 / 2, sigma, n)      # E[noise] = 1
    return X, mean_ms, mean_ms * noise


def test_reweighted_fit_is_unbiased_in_total_time_where_plain_relative_fit_is_low():
    X, mean_ms, y = skewed_steps(0)
    X_test, mean_test, y_test = skewed_steps(1)
    unbiased = AdditiveGridRegressor(n_knots=6).fit(X, y)
    plain = AdditiveGridRegressor(n_knots=6, reweight=0).fit(X, y)
    ratio = unbiased.predict(X_test).sum() / y_test.sum()
    plain_ratio = plain.predict(X_test).sum() / y_test.sum()
    assert abs(ratio - 1.0) < 0.02
    assert plain_ratio < 0.95          # 1/measured weights favour the fast samples
    # And it tracks the true mean law point by point, not only in total.
    assert np.median(np.abs(unbiased.predict(X_test) / mean_test - 1.0)) < 0.03
