import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from stepcal.costmodel.additive import AdditiveGridRegressor
from stepcal.costmodel.regressors import PhysicsResidualRegressor, TreeRegressor, make_regressor


def gemm_data(ms, n=1024, k=1024):
    m = np.asarray(ms, dtype=np.float64)
    flops = 2 * m * n * k
    nbytes = 2 * (m * k + n * k + m * n)
    X = np.column_stack([m, np.full_like(m, n), np.full_like(m, k), flops, nbytes])
    # a roofline-ish device: memory-bound for few rows, compute-bound for many
    y = 0.005 + np.maximum(flops / 4e11, nbytes / 2e9)
    return X, y


def test_estimators_follow_sklearn_rules():
    X, y = gemm_data(np.arange(1, 200, 3))
    for est in (TreeRegressor(n_estimators=10), AdditiveGridRegressor(n_knots=5),
                PhysicsResidualRegressor(physics_index=(3, 4), n_estimators=10)):
        with pytest.raises(NotFittedError):
            est.predict(X)
        assert est.fit(X, y) is est
        assert clone(est).get_params() == est.get_params()
        assert est.predict(X).shape == (len(X),)
        assert not hasattr(clone(est), "n_features_in_")


def test_physics_model_extrapolates_where_a_forest_goes_flat():
    X_train, y_train = gemm_data(np.arange(1, 1025, 8))
    X_test, y_test = gemm_data([2048, 4096, 8192])
    physics = PhysicsResidualRegressor(physics_index=(3, 4), n_estimators=30).fit(X_train, y_train)
    forest = TreeRegressor(n_estimators=30).fit(X_train, y_train)
    physics_err = np.abs(physics.predict(X_test) / y_test - 1)
    forest_err = np.abs(forest.predict(X_test) / y_test - 1)
    # 8x past the data, across the knee of the roofline: close, where the forest is not
    assert physics_err.max() < 0.15
    assert forest_err.min() > 0.3 and forest_err.max() > 0.7   # stuck at its value at m = 1024


def test_spread_is_zero_where_the_trees_agree_and_follows_the_scatter():
    X, y = gemm_data(np.arange(1, 300, 2))
    for family in ("rf", "physics"):
        flat = make_regressor(family, {"n_estimators": 30}, (3, 4)).fit(X, np.full(len(y), 0.7))
        np.testing.assert_allclose(flat.predict_spread(X), 0.0, atol=1e-12)   # every tree says 0.7
    rng = np.random.default_rng(0)
    # Log-normal scatter of 5% and 20%: the trees' median spread, relative to the prediction,
    # is about half of it (measured 2.6% and 12-13%).
    for sigma, (low, high) in ((0.05, (0.015, 0.05)), (0.2, (0.07, 0.2))):
        noisy = y * np.exp(rng.normal(0, sigma, len(y)))
        for family in ("rf", "physics"):
            est = make_regressor(family, {"n_estimators": 30}, (3, 4)).fit(X, noisy)
            relative = np.median(est.predict_spread(X) / est.predict(X))
            assert low < relative < high, (family, sigma, relative)
    boosting = make_regressor("hgb", {}, (3, 4)).fit(X, y * np.exp(rng.normal(0, 0.2, len(y))))
    assert not boosting.predict_spread(X).any()            # one additive model: no spread


def test_additive_grid_recovers_an_additive_law():
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 1000, size=(400, 2))
    y = 1.0 + 0.01 * X[:, 0] + 2.0 * np.sqrt(X[:, 1])
    est = AdditiveGridRegressor(n_knots=12, smoothing=1e-4).fit(X, y)
    X_test = rng.uniform(1, 1000, size=(100, 2))
    y_test = 1.0 + 0.01 * X_test[:, 0] + 2.0 * np.sqrt(X_test[:, 1])
    assert np.abs(est.predict(X_test) / y_test - 1).mean() < 0.03   # sqrt bends between knots


def test_times_must_be_positive():
    X, y = gemm_data([1, 2, 3, 4])
    y[2] = 0.0
    with pytest.raises(ValueError, match="positive"):
        TreeRegressor(n_estimators=5).fit(X, y)


def test_trim_drops_glitched_training_rows_and_their_damage():
    X, y = gemm_data(np.arange(8, 2048, 8))
    glitched = y.copy()
    bad = np.arange(5, len(y), 25)                  # ten points measured 3x too slow
    glitched[bad] *= 3.0
    params = dict(physics_index=(3, 4), n_estimators=30, random_state=0)
    plain = PhysicsResidualRegressor(**params).fit(X, glitched)
    trimmed = PhysicsResidualRegressor(trim=0.4, **params).fit(X, glitched)
    assert trimmed.n_trimmed_ >= len(bad) and plain.n_trimmed_ == 0
    near = np.setdiff1d(np.concatenate([bad - 1, bad + 1]), bad)
    err = lambda est: np.abs(est.predict(X[near]) / y[near] - 1).mean()  # noqa: E731
    assert err(trimmed) < 0.05 < err(plain)


def test_tile_features_of_gemm_and_prefill_attention():
    from stepcal.costmodel.features import design
    from stepcal.costmodel.records import make_records
    gemm = make_records(dict(row=[0, 1, 2], op="gemm", m=[128.0, 129.0, 64.0], n=[300.0] * 3,
                             k=[64.0] * 3, time_ms=[1.0] * 3), source="t", file="t")
    d = design("gemm", gemm)
    col = {name: d.X[:, i] for i, name in enumerate(d.names)}
    # a partly filled tile costs a whole one: 129 rows take two 128-row tiles
    np.testing.assert_array_equal(col["m_tiles_128"], [1, 2, 1])
    np.testing.assert_array_equal(col["m_tiles_64"], [2, 3, 1])
    np.testing.assert_array_equal(col["tiles_128"], [3, 6, 3])
    assert "m_tiles_128" not in [d.names[i] for i in d.physics_index]
    # two prompts of 256 tokens, 4 heads: 2 q tiles each, causal 1 + 2 score tiles per head
    attn = make_records(dict(row=[0], op="attn_prefill", num_seqs=[2.0], prefill_tokens=[512.0],
                             prefill_attn_work=[2 * 256 * 257 / 2], kv_sum=[0.0], num_heads=[4.0],
                             num_kv_heads=[4.0], head_dim=[128.0], time_ms=[1.0]),
                        source="t", file="t")
    d = design("attn_prefill", attn)
    assert d.X[0, d.names.index("tile_work")] == 2 * 4 * 3


def test_a_physics_model_pickled_before_fallback_was_always_set_loads_and_predicts_alike():
    X, y = gemm_data(np.arange(1, 300, 2))
    est = PhysicsResidualRegressor(physics_index=(3, 4), n_estimators=10).fit(X, y)
    state = est.__getstate__()
    del state["fallback_ms_"]                 # what fits without the fallback used to pickle
    old = PhysicsResidualRegressor.__new__(PhysicsResidualRegressor)
    old.__setstate__(state)
    assert old.fallback_ms_ == 0.0
    np.testing.assert_array_equal(old.predict(X), est.predict(X))


def test_attention_physics_has_a_per_sequence_term_and_extrapolates_a_per_sequence_cost():
    """Each sequence of a decode batch is its own work (a kernel call per sequence on the CPU, its own
    blocks on a GPU): a per-sequence cost that blocks (which also grow with the context) cannot stand
    for. On the CPU quick grid this took attention decode's held-out error from 93% to 12%."""
    from stepcal.costmodel.features import design
    from stepcal.costmodel.records import make_records
    rng = np.random.default_rng(0)
    b = rng.choice([1, 2, 4, 8, 16, 32], 60).astype(float)
    kv_max = rng.choice([128.0, 1024.0, 4096.0], 60)
    kv_sum = b * kv_max * rng.uniform(0.3, 1.0, 60)
    time_ms = 0.03 * b + 2e-5 * kv_sum + 0.01           # 30 us per sequence, 20 ns per cached token

    def rows(b, kv_sum, kv_max, time_ms):
        return make_records(dict(row=np.arange(len(b)), op="attn_decode", num_decode=b, decode_kv_sum=kv_sum,
                                 decode_kv_max=kv_max, num_heads=4.0, num_kv_heads=2.0, head_dim=64.0,
                                 dtype="float32", time_ms=time_ms), source="t", file="t")
    train = design("attn_decode", rows(b, kv_sum, kv_max, time_ms))
    assert "num_decode" in [train.names[i] for i in train.physics_index]
    prefill = design("attn_prefill", make_records(dict(
        row=[0], op="attn_prefill", num_seqs=[1.0], prefill_tokens=[8.0], prefill_attn_work=[36.0], kv_sum=[0.0],
        num_heads=[4.0], num_kv_heads=[2.0], head_dim=[64.0], time_ms=[1.0]), source="t", file="t"))
    assert "num_seqs" in [prefill.names[i] for i in prefill.physics_index]
    big = np.array([128.0, 256.0])                          # 4 to 8 times the largest batch fitted
    test = design("attn_decode", rows(big, big * 128, np.full(2, 128.0), 0.03 * big + 2e-5 * big * 128 + 0.01))
    model = PhysicsResidualRegressor(physics_index=train.physics_index, n_estimators=30).fit(
        train.X, np.asarray(time_ms))
    truth = 0.03 * big + 2e-5 * big * 128 + 0.01
    assert np.abs(model.predict(test.X) / truth - 1).max() < 0.1
