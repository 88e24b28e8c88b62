"""The tuner's objective for whole steps: random folds scored by mean and time-weighted APE."""
import numpy as np
import pytest

from stepcal.costmodel.additive import AdditiveGridRegressor
from stepcal.costmodel.tuning import _folds, _score, tune


def steps_with_a_few_big_prefills(seed: int = 0):
    """Many small steps on a gentle line, and 1% big prefill steps whose time bends upward (as a
    served profile's steps of over 4,096 tokens do): X = (num_tokens,), y in ms."""
    rng = np.random.default_rng(seed)
    small = rng.uniform(1, 1024, 1980)
    big = rng.uniform(4096, 8192, 20)
    tokens = np.concatenate([small, big])
    time_ms = 2.0 + 0.01 * tokens + 2e-6 * np.maximum(tokens - 2048, 0) ** 2
    return tokens[:, None], time_ms * rng.lognormal(0.0, 0.03, len(tokens)), tokens > 4096


def test_whole_steps_are_tuned_on_random_folds_only():
    rng = np.random.default_rng(0)
    size = np.arange(40.0)
    assert len(_folds(40, size, rng)) == 4          # ops: the extrapolation fold first
    folds = _folds(40, None, rng)
    assert len(folds) == 3
    tested = np.sort(np.concatenate([test for _, test in folds]))
    np.testing.assert_array_equal(tested, np.arange(40))   # each row scored once


def test_time_weighted_score_counts_a_big_step_by_its_time():
    measured = np.array([1.0] * 9 + [100.0])
    small_off = measured * np.array([1.3] + [1.0] * 9)
    big_off = measured * np.array([1.0] * 9 + [1.3])
    assert _score(measured, small_off, False) == pytest.approx(_score(measured, big_off, False))
    assert _score(measured, big_off, True) > 5 * _score(measured, small_off, True)


def test_tuned_whole_steps_price_the_few_big_prefills():
    X, y, big = steps_with_a_few_big_prefills()
    monotone = [True]

    def build(choice):
        return AdditiveGridRegressor(**choice.params, monotone=monotone)
    choice, trials = tune(build, X, y, X[:, 0], kind="step", has_physics=False, n_trials=3, seed=0)
    assert len(trials) == 3
    fitted = build(choice).fit(X, y)
    assert y[big].sum() / fitted.predict(X[big]).sum() == pytest.approx(1.0, abs=0.05)
    # the smooth starting point, which the extrapolation fold used to pick, does not
    smooth = AdditiveGridRegressor(n_knots=3, smoothing=0.1, monotone=monotone).fit(X, y)
    assert y[big].sum() / smooth.predict(X[big]).sum() > 1.08
