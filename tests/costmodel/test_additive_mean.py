"""The whole-step table model predicts each batch's mean time, not a low-biased relative fit."""
import numpy as np
import pytest

from stepcal.costmodel.additive import AdditiveGridRegressor


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


def grid_steps():
    """Whole steps as a profile's grid holds them: decodes alone, one fresh prompt alone, one prompt
    beside decodes; so num_seqs is num_decode or one more, and the features trade off. The law:
    each sequence costs 0.05 ms, each prompt 0.3 ms more, each token 0.01 ms."""
    rows = [(d, 0, 0) for d in (1, 2, 4, 8, 16, 32, 64)] + [(0, 1, q) for q in (16, 64, 128, 512)]
    rows += [(4, 1, 64), (16, 1, 256), (64, 1, 64)]
    return np.array(rows, dtype=float)


def step_law(rows):
    num_decode, num_prefill, prefill_tokens = rows.T
    return 1.0 + 0.05 * (num_decode + num_prefill) + 0.3 * num_prefill + 0.01 * (num_decode + prefill_tokens)


def features(rows):
    """(num_seqs, num_tokens, num_decode, prefill_tokens), as the step's table axes count them."""
    num_decode, num_prefill, prefill_tokens = rows.T
    return np.column_stack([num_decode + num_prefill, num_decode + prefill_tokens, num_decode, prefill_tokens])


def test_monotone_curves_never_fall_and_more_work_never_costs_less():
    rows = grid_steps()
    X, y = features(rows), step_law(rows)
    model = AdditiveGridRegressor(n_knots=8, smoothing=1e-3, monotone=True).fit(X, y)
    for values in model.values_:
        assert np.all(np.diff(values) >= -1e-9)
    # Steps the grid never held: the same 64 prompt tokens in one, two or three prompts beside 8 decodes.
    chunks = np.array([(8, k, 64) for k in (1, 2, 3)], dtype=float)
    assert np.all(np.diff(model.predict(features(chunks))) >= -1e-9)
    assert np.abs(model.predict(X) / y - 1).max() < 0.1


def test_a_per_prompt_cost_needs_the_decode_curve_free():
    """The law's per-prompt 0.3 ms is num_seqs - num_decode: with every curve rising the fit cannot say
    it (more prompts come out too cheap); with num_decode's curve free (as the step target has it,
    costmodel.features) it does, and the other curves still never fall."""
    rows = grid_steps()
    X, y = features(rows), step_law(rows)
    chunks = np.array([(8, k, 64) for k in (1, 2, 3)], dtype=float)
    every = AdditiveGridRegressor(n_knots=8, smoothing=1e-3, monotone=True).fit(X, y)
    free = AdditiveGridRegressor(n_knots=8, smoothing=1e-3, monotone=(True, True, False, True)).fit(X, y)
    assert np.abs(free.predict(features(chunks)) / step_law(chunks) - 1).max() < 0.02
    assert every.predict(features(chunks))[2] < 0.9 * step_law(chunks)[2]
    for j in (0, 1, 3):
        assert np.all(np.diff(free.values_[j]) >= -1e-9)
    with pytest.raises(ValueError, match="flags"):
        AdditiveGridRegressor(monotone=(True, False)).fit(X, y)


def test_step_fits_hold_every_curve_but_the_decodes_rising():
    from stepcal.core.batch import FEATURE_NAMES
    from stepcal.costmodel.features import KINDS
    flags = KINDS["step"].increasing(FEATURE_NAMES)
    assert [name for name, up in zip(FEATURE_NAMES, flags) if not up] == ["num_decode"]
    assert all(KINDS["host"].increasing(("num_seqs", "num_tokens")))


def test_knots_a_rounding_error_apart_are_merged():
    # the quantiles give 8.0 and the geometric ladder 7.999999999999998: one knot, not two
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0])
    knots = AdditiveGridRegressor(n_knots=9)._knots(x)
    assert np.all(np.diff(knots) > 1e-6)
    # and a fit on them keeps its scale (with both, its solve came back all zeros)
    X = np.column_stack([x, np.sqrt(x)])
    y = 1.0 + 0.1 * x
    for monotone in (True, False):
        model = AdditiveGridRegressor(n_knots=9, smoothing=0.02, monotone=monotone).fit(X, y)
        assert np.abs(model.predict(X) / y - 1).max() < 0.05


def test_bootstrap_refits_run_on_one_blas_thread(monkeypatch):
    """The spread's refits are small QR solves in a loop: one BLAS thread each, so that a busy
    second core does not stall them (they ran 1.5x slower on two threads beside one busy core)."""
    from threadpoolctl import threadpool_info

    import stepcal.costmodel.additive as additive
    X, _, y = skewed_steps(2, n=400)
    model = AdditiveGridRegressor(n_knots=4).fit(X, y)
    seen = []
    refit = additive._refit_on_knots

    def recording(estimator, X_rows, y_rows):
        seen.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        return refit(estimator, X_rows, y_rows)

    monkeypatch.setattr(additive, "_refit_on_knots", recording)
    spread = additive.bootstrap_relative_spread(model, X, y, num_fits=3)
    assert seen == [{1}] * 3
    assert 0 < spread < 0.5
