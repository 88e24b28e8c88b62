"""scikit-learn's own checks of its conventions, on every estimator class in costmodel."""
import numpy as np
from sklearn.utils.estimator_checks import parametrize_with_checks

from stepcal.costmodel.additive import AdditiveGridRegressor
from stepcal.costmodel.regressors import PhysicsResidualRegressor, TreeRegressor

# Small ensembles: the checks fit each estimator some sixty times.
ESTIMATORS = [
    TreeRegressor(n_estimators=5),
    TreeRegressor(tree="hgb", max_iter=10),
    PhysicsResidualRegressor(physics_index=(0,), n_estimators=5),
    PhysicsResidualRegressor(physics_index=(0,), residual="additive", tree="et", n_estimators=5,
                             trim=0.4),
    AdditiveGridRegressor(n_knots=4),
    AdditiveGridRegressor(n_knots=4, monotone=True),
]


def expected_failed_checks(estimator) -> dict:
    if hasattr(estimator, "max_iter"):
        # The check reads a `max_iter` parameter as "this estimator iterates" and wants n_iter_.
        # Here max_iter is only handed on to the boosting variant's model (tree="hgb"): the
        # estimator itself does not iterate, and forests have no iterations to count.
        return {"check_non_transformer_estimators_n_iter":
                "max_iter is a hyperparameter of the wrapped boosting model; no n_iter_ to report"}
    return {}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_refit_learns_afresh_after_a_fit_without_usable_physics():
    """A fit whose physics column is all zero falls back to a constant; a refit on data with
    physics must forget that constant and predict as a fresh fit does."""
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 100, 60)
    X, y = np.column_stack([x]), 0.5 + 0.1 * x
    no_physics = np.column_stack([np.zeros(60)])
    params = dict(physics_index=(0,), intercept=False, n_estimators=5)
    refit = PhysicsResidualRegressor(**params).fit(no_physics, y)
    assert refit.fallback_ms_ == float(np.median(y)) and not refit.coef_.any()
    refit.fit(X, y)
    fresh = PhysicsResidualRegressor(**params).fit(X, y)
    assert refit.fallback_ms_ == fresh.fallback_ms_ == 0.0
    np.testing.assert_array_equal(refit.predict(X), fresh.predict(X))
